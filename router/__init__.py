"""grove's router: the lifecycle API, the id→endpoint map and data-path proxy, backends, SDK and CLI."""
