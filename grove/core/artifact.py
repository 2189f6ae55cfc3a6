"""One stored artifact as the artifact index records it, the API lists it and the SDK hands it out: one model.

Where its bytes and index entries live is :mod:`artifacts.catalog`'s; this is what an entry says.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import asdict, dataclass, fields
from typing import Any

from grove.core.errors import Invalid

KINDS = ("file", "stdout", "stderr")
"""``file``: pushed with ``POST …/artifacts``; ``stdout``/``stderr``: a truncated command's full output."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Artifact:
    """One stored artifact, as its index entry records it."""

    sandbox_id: str
    """The sandbox it came from."""
    path: str
    """Its absolute path in the sandbox (for a full output: the file the executor spilled it to)."""
    key: str
    """Its key in the bucket."""
    size: int
    """Its size in bytes when it was stored."""
    sha256: str
    """The sha256 of its bytes when it was stored (hex)."""
    created_at: float
    """When it was stored (seconds since the epoch)."""
    kind: str = "file"
    """``file`` (pushed with ``POST …/artifacts``), or ``stdout``/``stderr`` (a truncated command's full output)."""
    task_id: str | None = None
    """The sandbox's ``metadata.task_id``."""
    run_id: str | None = None
    """The sandbox's ``metadata.labels.run_id``."""
    etag: str | None = None
    """The S3 entity tag of the object when it was stored."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise Invalid(f"artifact kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not _SHA256.fullmatch(self.sha256):
            raise Invalid(f"artifact sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    def to_json(self) -> bytes:
        """The entry's JSON body."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Artifact:
        """An entry from its JSON body (Invalid if it is not one)."""
        try:
            fields = json.loads(data)
            if not isinstance(fields, dict):
                raise TypeError("not an object")
            return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})
        except (ValueError, TypeError) as exc:
            raise Invalid(f"not an artifact index entry: {exc}") from exc

    def public(self) -> dict[str, Any]:
        """The entry as the API lists it, with the route that fetches it."""
        return {**asdict(self), "fetch": self.route}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Artifact:
        """From an entry of an API listing (fields this version does not know, such as ``fetch``, ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def route(self) -> str:
        """The router path that streams it."""
        return fetch_route(self.sandbox_id, self.path)


def fetch_route(sandbox_id: str, path: str) -> str:
    """The router path that streams an artifact: ``/v1/artifacts/<sandbox_id>/<path>``."""
    return f"/v1/artifacts/{sandbox_id}/" + urllib.parse.quote(path.lstrip("/"), safe="/._-~")
