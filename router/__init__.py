"""grove's router, the server: the HTTP API (api/), the sandboxes' lifecycle (lifecycle/), warm pools (pools/), the
trajectory (trajectory/), the router's records (records/), the executor's client (upstream/), the backends
(backends/local, backends/knative) and the viewer (ui/). The SDK and the CLI are grove's (grove.client, grove.cli);
what all of them share is the kernel, grove.core."""
