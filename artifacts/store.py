"""Objects in one S3 bucket through the ``minio`` client: put, get, list, delete and presigned URLs.

Synchronous by design (the router calls it through ``asyncio.to_thread``) and thread-safe (the minio
client is, and the bucket check is guarded). Every failure leaves as a :class:`grove.core.errors.GroveError`:
an unreachable server is ``Unavailable`` naming the endpoint, a missing key ``NotFound``, refused
credentials ``Forbidden``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import io
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO, cast

import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.datatypes import Part
from minio.error import InvalidResponseError, S3Error, ServerError
from minio.lifecycleconfig import LifecycleConfig

from artifacts.s3config import S3Config
from artifacts.streams import ObjectReader, Readable, as_reader
from grove.core.errors import Forbidden, GroveError, InternalError, Invalid, NotFound, Unavailable

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NotFound", "ResourceNotFound"}
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_INVALID = {"InvalidBucketName", "InvalidArgument", "KeyTooLongError", "InvalidObjectName", "EntityTooLarge",
            "NotImplemented", "MalformedXML", "InvalidRequest"}
_MAX_EXPIRY = timedelta(days=7)  # S3's limit for SigV4 presigned URLs


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object."""

    key: str
    """Its key in the bucket."""
    size: int
    """Its size in bytes."""
    etag: str | None
    """The server's entity tag."""
    last_modified: float | None
    """When it was last written (seconds since the epoch)."""


class ObjectStore:
    """One bucket on one S3 server; the bucket is created on first use."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        """Where and how: endpoint, credentials, bucket."""
        # minio's default pool retries five times with backoff and waits 5 minutes to connect; a down
        # server must fail in well under a second so the archive can spool instead.
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=config.connect_timeout_s, read=config.read_timeout_s),
            maxsize=16,
            retries=urllib3.Retry(total=2, connect=0, backoff_factor=0.1, status_forcelist=(500, 502, 503, 504)),
        )
        self._client = self._minio(config.host, config.secure)
        same = config.public_host == config.host and config.public_secure == config.secure
        # A presigned URL signs the Host header, so URLs for another name need a client of that name
        # (it only signs: with the region fixed it never connects).
        self._signer = self._client if same else self._minio(config.public_host, config.public_secure)
        self._bucket_lock = threading.Lock()
        self._bucket_ready = False

    def _minio(self, host: str, secure: bool) -> Minio:
        c = self.config
        return Minio(host, c.access_key, c.secret_key, secure=secure, region=c.region, http_client=self._http)

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (once per store; retried after a failure)."""
        if self._bucket_ready:
            return
        with self._bucket_lock, self._errors("create bucket", None):
            if self._bucket_ready:
                return
            if not self._client.bucket_exists(self.config.bucket):
                try:
                    self._client.make_bucket(self.config.bucket)
                except S3Error as exc:  # another process made it between our check and our call
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
            self._bucket_ready = True

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str | None:
        """Store ``data`` under ``key``; return the server's etag."""
        return self.put_stream(key, io.BytesIO(data), length=len(data), content_type=content_type)

    def put_file(self, key: str, path: str | Path, content_type: str = "application/octet-stream") -> str | None:
        """Upload a local file, in parts when larger than the part size; return the etag."""
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, after the size is known
        except FileNotFoundError as exc:
            raise NotFound(f"no such file: {path}") from exc
        with fh:
            size = Path(path).stat().st_size
            return self.put_stream(key, fh, length=size, content_type=content_type)

    def put_stream(
        self,
        key: str,
        stream: Readable | Iterable[bytes],
        length: int = -1,
        content_type: str = "application/octet-stream",
    ) -> str | None:
        """Upload a byte stream (``length`` -1: unknown, sent as multipart); return the etag."""
        reader = as_reader(stream)
        self.ensure_bucket()
        with self._errors("put", key):
            result = self._client.put_object(
                self.config.bucket,
                key,
                cast(BinaryIO, reader),  # minio only calls read(n)
                length,
                content_type=content_type,
                part_size=self.config.part_size,
            )
        etag = getattr(result, "etag", None)
        return str(etag) if etag is not None else None

    def get_bytes(self, key: str) -> bytes:
        """The whole object (NotFound if missing)."""
        with self.get_stream(key) as reader:
            return reader.read()

    def get_stream(self, key: str, offset: int = 0, length: int = 0) -> ObjectReader:
        """A reader over the object (from ``offset``, ``length`` bytes; 0: to the end), streamed from the
        server; close it (it is a context manager)."""
        self.ensure_bucket()
        with self._errors("get", key):
            response = self._client.get_object(self.config.bucket, key, offset=offset, length=length)
        return ObjectReader(response, lambda exc: self._translate(exc, "read", key))

    def stat(self, key: str) -> ObjectInfo:
        """Size, etag and time of ``key`` (NotFound if missing)."""
        self.ensure_bucket()
        with self._errors("stat", key):
            obj = self._client.stat_object(self.config.bucket, key)
        return ObjectInfo(key=key, size=int(obj.size or 0), etag=obj.etag,
                          last_modified=obj.last_modified.timestamp() if obj.last_modified else None)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        self.ensure_bucket()
        try:
            with self._errors("stat", key):
                self._client.stat_object(self.config.bucket, key)
        except NotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is already gone: S3 deletes are idempotent)."""
        self.ensure_bucket()
        with self._errors("delete", key):
            self._client.remove_object(self.config.bucket, key)

    def copy(self, source: str, target: str) -> None:
        """Copy ``source`` to ``target`` inside the bucket (server-side: no byte passes through here)."""
        self.ensure_bucket()
        with self._errors("copy", source):
            self._client.copy_object(self.config.bucket, target, CopySource(self.config.bucket, source))

    def presign_get(self, key: str, expires: float | timedelta = 3600.0) -> str:
        """A URL that GETs ``key`` without credentials until it expires (seconds or a timedelta)."""
        self.ensure_bucket()
        with self._errors("presign", key):
            return str(self._signer.presigned_get_object(self.config.bucket, key, expires=_expiry(expires)))

    def presign_put(self, key: str, expires: float | timedelta = 3600.0) -> str:
        """A URL that PUTs ``key`` (one request, with Content-Length) without credentials until it expires."""
        self.ensure_bucket()
        with self._errors("presign", key):
            return str(self._signer.presigned_put_object(self.config.bucket, key, expires=_expiry(expires)))

    # Multipart uploads, for writers that hold no credentials: the holder of the credentials starts and
    # ends the upload, the writer PUTs each part to a presigned URL (every S3, AWS included, accepts that).

    def start_multipart(self, key: str) -> str:
        """Start a multipart upload of ``key``; its upload id (nothing is visible until it is completed)."""
        self.ensure_bucket()
        with self._errors("start an upload of", key):
            return str(self._client._create_multipart_upload(self.config.bucket, key, {}))

    def presign_part(self, key: str, upload_id: str, number: int, expires: float | timedelta = 3600.0) -> str:
        """A URL that PUTs part ``number`` (1-10000) of an upload without credentials."""
        with self._errors("presign", key):
            return str(self._signer.get_presigned_url(
                "PUT", self.config.bucket, key, expires=_expiry(expires),
                extra_query_params={"uploadId": upload_id, "partNumber": str(number)}))

    def complete_multipart(self, key: str, upload_id: str, etags: builtins.list[str]) -> str | None:
        """Make ``key`` the parts' concatenation (parts 1..n, in order) at once; the new etag."""
        with self._errors("complete the upload of", key):
            parts = [Part(number, etag) for number, etag in enumerate(etags, 1)]
            return self._client._complete_multipart_upload(self.config.bucket, key, upload_id, parts).etag

    def uploaded_bytes(self, key: str, upload_id: str) -> int:
        """The bytes of an upload's parts so far (a presigned part URL does not bound its part's size)."""
        total, marker = 0, None
        with self._errors("list the parts of", key):
            while True:
                listed = self._client._list_parts(self.config.bucket, key, upload_id, part_number_marker=marker)
                total += sum(part.size or 0 for part in listed.parts)
                if not listed.is_truncated or not listed.next_part_number_marker:
                    return total
                marker = listed.next_part_number_marker

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an upload and its parts (no error if it is gone); ``key`` keeps what it had."""
        try:
            with self._errors("abort the upload of", key):
                self._client._abort_multipart_upload(self.config.bucket, key, upload_id)
        except NotFound:
            pass

    def incomplete_uploads(self, prefix: str) -> builtins.list[tuple[str, str]]:
        """(key, upload id) of the uploads under ``prefix`` that were neither completed nor aborted."""
        self.ensure_bucket()
        with self._errors("list uploads under", prefix):
            found = self._client._list_multipart_uploads(self.config.bucket, prefix=prefix, max_uploads=1000)
            return [(str(u.object_name), str(u.upload_id)) for u in found.uploads]

    def close(self) -> None:
        """Drop pooled connections."""
        self._http.clear()

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prefixes(self, prefix: str) -> builtins.list[str]:
        """The "directories" right under ``prefix`` (which ends in '/'), each ending in '/', in key order."""
        self.ensure_bucket()
        with self._errors("list", prefix):
            return [str(obj.object_name) for obj in self._client.list_objects(self.config.bucket, prefix=prefix)
                    if obj.is_dir]

    def list(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""
        self.ensure_bucket()
        with self._errors("list", prefix):
            return [
                ObjectInfo(
                    key=str(obj.object_name),
                    size=int(obj.size or 0),
                    etag=obj.etag,
                    last_modified=obj.last_modified.timestamp() if obj.last_modified else None,
                )
                for obj in self._client.list_objects(self.config.bucket, prefix=prefix, recursive=recursive)
                if not obj.is_dir
            ]

    def list_after(self, prefix: str, after: str | None = None) -> Iterator[str]:
        """Keys under ``prefix`` after ``after``, in key order, fetched page by page as the caller reads."""
        self.ensure_bucket()
        with self._errors("list", prefix):
            # minio fetches the next page of the listing only when the iterator reaches it.
            for obj in self._client.list_objects(self.config.bucket, prefix=prefix, recursive=True,
                                                 start_after=after):
                if not obj.is_dir:
                    yield str(obj.object_name)

    def lifecycle(self) -> LifecycleConfig | None:
        """The bucket's lifecycle configuration (None if it has none)."""
        self.ensure_bucket()
        with self._errors("get lifecycle of", None):
            return self._client.get_bucket_lifecycle(self.config.bucket)

    def set_lifecycle(self, config: LifecycleConfig | None) -> None:
        """Replace the bucket's lifecycle configuration (None or no rules: remove it)."""
        self.ensure_bucket()
        with self._errors("set lifecycle of", None):
            if config is None or not config.rules:
                self._client.delete_bucket_lifecycle(self.config.bucket)
            else:
                self._client.set_bucket_lifecycle(self.config.bucket, config)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        try:
            yield
        except GroveError:
            raise
        except (S3Error, ServerError, InvalidResponseError, urllib3.exceptions.HTTPError, ValueError) as exc:
            raise self._translate(exc, op, key) from exc

    def _translate(self, exc: BaseException, op: str, key: str | None) -> GroveError:
        where = f"S3 at {self.config.endpoint}"
        what = f"{op} {self.config.bucket}/{key}" if key is not None else f"{op} {self.config.bucket}"
        if isinstance(exc, S3Error):
            code = exc.code or ""
            status = int(getattr(exc.response, "status", 0) or 0)
            if code in _NOT_FOUND or status == 404:
                return NotFound(f"{what}: not found ({code or status})")
            if code in _REFUSED or status == 403:
                return Forbidden(f"{where} refused the credentials for {what}: {code} {exc.message or ''}".rstrip())
            if code in _INVALID:
                return Invalid(f"{what}: {code} {exc.message or ''}".rstrip())
            if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
                return Unavailable(f"{where} failed to {what}: {code} {exc.message or ''}".rstrip(), retry_after=5)
            return InternalError(f"{where}: {what}: {code} {exc.message or ''}".rstrip())
        if isinstance(exc, ValueError):
            return Invalid(f"{what}: {exc}")
        return Unavailable(f"{where} is unreachable ({what}): {_reason(exc)}", retry_after=5)


def _expiry(expires: float | timedelta) -> timedelta:
    delta = expires if isinstance(expires, timedelta) else timedelta(seconds=expires)
    if not timedelta(seconds=1) <= delta <= _MAX_EXPIRY:
        raise Invalid(f"presigned URL expiry must be between 1 s and 7 days, got {delta}")
    return delta


def _reason(exc: BaseException) -> str:
    # urllib3 wraps the OS error (e.g. connection refused) in MaxRetryError.reason; show the root.
    reason: Any = getattr(exc, "reason", None)
    return str(reason or exc)


class ScopedStore(ObjectStore):
    """The same bucket seen under a key prefix (a project's ``projects/<name>/``): every key its callers give
    is taken below the prefix, every key it lists comes back without it, so code written for a whole bucket
    works on one project's part of it and cannot reach past it. It shares its base's connections."""

    def __init__(self, base: ObjectStore, prefix: str) -> None:
        if not prefix.endswith("/") or prefix.startswith("/"):
            raise ValueError(f"a scope is a key prefix ending in '/', got {prefix!r}")
        self.__dict__.update(base.__dict__)
        self.prefix = prefix
        """Where this view's keys live in the bucket."""

    def full_key(self, key: str) -> str:
        """``key`` as the bucket knows it."""
        return self.prefix + key

    def _inner(self, key: str) -> str:
        return key[len(self.prefix):] if key.startswith(self.prefix) else key

    def put_stream(self, key: str, stream: Readable | Iterable[bytes], length: int = -1,
                   content_type: str = "application/octet-stream") -> str | None:
        return super().put_stream(self.prefix + key, stream, length, content_type)

    def get_stream(self, key: str, offset: int = 0, length: int = 0) -> ObjectReader:
        return super().get_stream(self.prefix + key, offset, length)

    def stat(self, key: str) -> ObjectInfo:
        return dataclasses.replace(super().stat(self.prefix + key), key=key)

    def exists(self, key: str) -> bool:
        return super().exists(self.prefix + key)

    def delete(self, key: str) -> None:
        super().delete(self.prefix + key)

    def copy(self, source: str, target: str) -> None:
        super().copy(self.prefix + source, self.prefix + target)

    def presign_get(self, key: str, expires: float | timedelta = 3600.0) -> str:
        return super().presign_get(self.prefix + key, expires)

    def presign_put(self, key: str, expires: float | timedelta = 3600.0) -> str:
        return super().presign_put(self.prefix + key, expires)

    def start_multipart(self, key: str) -> str:
        return super().start_multipart(self.prefix + key)

    def presign_part(self, key: str, upload_id: str, number: int, expires: float | timedelta = 3600.0) -> str:
        return super().presign_part(self.prefix + key, upload_id, number, expires)

    def complete_multipart(self, key: str, upload_id: str, etags: builtins.list[str]) -> str | None:
        return super().complete_multipart(self.prefix + key, upload_id, etags)

    def uploaded_bytes(self, key: str, upload_id: str) -> int:
        return super().uploaded_bytes(self.prefix + key, upload_id)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        super().abort_multipart(self.prefix + key, upload_id)

    def incomplete_uploads(self, prefix: str) -> builtins.list[tuple[str, str]]:
        return [(self._inner(k), u) for k, u in super().incomplete_uploads(self.prefix + prefix)]

    def prefixes(self, prefix: str) -> builtins.list[str]:
        return [self._inner(p) for p in super().prefixes(self.prefix + prefix)]

    def list(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[ObjectInfo]:
        return [dataclasses.replace(info, key=self._inner(info.key))
                for info in super().list(self.prefix + prefix, recursive=recursive)]

    def list_after(self, prefix: str, after: str | None = None) -> Iterator[str]:
        for key in super().list_after(self.prefix + prefix, None if after is None else self.prefix + after):
            yield self._inner(key)

    def lifecycle(self) -> LifecycleConfig | None:
        raise NotImplementedError("lifecycle rules are the whole bucket's: ask the base store")

    def set_lifecycle(self, config: LifecycleConfig | None) -> None:
        raise NotImplementedError("lifecycle rules are the whole bucket's: ask the base store")
