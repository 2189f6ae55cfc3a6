"""Several routers, one per shard: a router's shard and peers, how routers sign the calls they pass on to each
other, and the passing on itself; the middleware steps using them are in ``router/api/shards.py`` (see
``knative/README.md``, "Several routers")."""
