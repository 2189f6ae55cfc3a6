"""Where the object store is and how to talk to it: one frozen, typed value built once and passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from grove.core.errors import Invalid


@dataclass(frozen=True)
class S3Config:
    """An S3 endpoint (MinIO, the embedded weed, any S3 server), its credentials and grove's bucket."""

    endpoint: str
    """Base URL, ``http://host:port`` or ``https://host``; TLS follows the scheme."""
    access_key: str
    """The access key id."""
    secret_key: str = field(repr=False)
    """The secret key (kept out of ``repr`` so it never lands in a log)."""
    bucket: str = "grove"
    """The bucket every key lives in; created on first use."""
    region: str = "us-east-1"
    """Signing region; set explicitly so presigning never asks the server for the bucket's location."""
    public_endpoint: str | None = None
    """Base URL presigned URLs point at, when consumers reach S3 by another name (default: ``endpoint``)."""
    connect_timeout_s: float = 3.0
    """TCP connect timeout: an S3 that is down must be noticed fast (the archive then spools)."""
    read_timeout_s: float = 120.0
    """Timeout for each read of a response."""
    part_size: int = 16 * 1024 * 1024
    """Multipart part size for uploads of unknown or large size (S3's minimum is 5 MiB)."""

    def __post_init__(self) -> None:
        for url in (self.endpoint, self.public_endpoint):
            if url is not None:
                _netloc(url)
        if not self.bucket:
            raise Invalid("S3 bucket name is empty")
        if self.part_size < 5 * 1024 * 1024:
            raise Invalid("S3 multipart part size must be at least 5 MiB")

    @property
    def secure(self) -> bool:
        """Whether to use TLS (the endpoint's scheme is https)."""
        return urlsplit(self.endpoint).scheme == "https"

    @property
    def host(self) -> str:
        """``host:port`` of ``endpoint``, as the ``minio`` client wants it."""
        return _netloc(self.endpoint)

    @property
    def public_host(self) -> str:
        """``host:port`` presigned URLs carry."""
        return _netloc(self.public_endpoint or self.endpoint)

    @property
    def public_secure(self) -> bool:
        """Whether presigned URLs use https."""
        return urlsplit(self.public_endpoint or self.endpoint).scheme == "https"


def _netloc(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Invalid(f"S3 endpoint must be an http(s) URL, got {url!r}")
    if parts.path.strip("/") or parts.query:
        raise Invalid(f"S3 endpoint must have no path or query (the bucket is separate), got {url!r}")
    return parts.netloc
