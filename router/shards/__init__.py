"""Several routers, one per shard: which router owns a sandbox (its id says), how routers sign calls they pass
on to each other, and the passing on itself (see ``knative/README.md``, "Several routers")."""
