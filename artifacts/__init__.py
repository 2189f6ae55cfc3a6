"""grove's object storage: S3 access, trajectories, the spool, snapshots, export, the embedded S3 server.

Modules, each importable on its own (nothing is imported here, so the executor's runtime bundle can
use :mod:`artifacts.snapshot` and :mod:`artifacts.presigned` without ``minio``):

- :mod:`artifacts.s3config` — ``S3Config``, the endpoint, credentials and bucket.
- :mod:`artifacts.store` — ``ObjectStore``: put/get/list/delete and presigned URLs over ``minio``;
  :mod:`artifacts.streams` — file-like adapters it reads and writes through.
- :mod:`artifacts.retention` — the bucket's lifecycle rules that grove owns.
- :mod:`artifacts.trajectory` — the record's msgpack encoding and the key layout with its index.
- :mod:`artifacts.archive` — ``TrajectoryArchive``: store, spool while S3 is down (:mod:`artifacts.spool`),
  flush, list, get.
- :mod:`artifacts.catalog` — where artifacts and their index entries live; :mod:`artifacts.artifact_index` —
  recording and listing them (the entry itself is the kernel's, :mod:`grove.core.artifact`).
- :mod:`artifacts.snapshot` — workspace tar + zstd, streamed, and back (:mod:`artifacts.unpack`);
  :mod:`artifacts.presigned` — presigned URLs with ``http.client``; :mod:`artifacts.multipart` — a stream of
  unknown length as one multipart upload.
- :mod:`artifacts.export` — chat-messages JSONL for SFT; :mod:`artifacts.export_screens` — computer steps in it,
  their screenshots as image content parts.
- :mod:`artifacts.s3server` — ``EmbeddedS3``, ``weed mini`` on loopback for one machine (:mod:`artifacts.s3proc`:
  its binary, ports, credentials and readiness).

This package imports neither ``executor`` nor ``router``.
"""
