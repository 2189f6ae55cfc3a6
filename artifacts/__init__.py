"""grove's object storage: S3 access, trajectories, the spool, snapshots, export, the embedded S3 server.

Modules, each importable on its own (nothing is imported here, so the executor's runtime bundle can
use :mod:`artifacts.snapshot` and :mod:`artifacts.presigned` without ``minio``):

- :mod:`artifacts.s3config` — ``S3Config``, the endpoint, credentials and bucket.
- :mod:`artifacts.store` — ``ObjectStore``: put/get/list/delete and presigned URLs over ``minio``.
- :mod:`artifacts.trajectory` — the record's msgpack encoding and the key layout with its index.
- :mod:`artifacts.archive` — ``TrajectoryArchive``: store, spool while S3 is down, flush, list, get.
- :mod:`artifacts.snapshot` — workspace tar + zstd, streamed; :mod:`artifacts.presigned` — http.client.
- :mod:`artifacts.export` — chat-messages JSONL for SFT.
- :mod:`artifacts.s3server` — ``EmbeddedS3``, ``weed mini`` on loopback for one machine.

This package imports neither ``executor`` nor ``router``.
"""
