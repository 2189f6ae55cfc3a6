"""The router's records of its sandboxes: the registry, their files and write-ahead log, the state disk."""
