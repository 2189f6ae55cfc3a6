"""The artifact index: where an artifact and its index entries live, what an entry says, page tokens.

Pure logic (no I/O); :mod:`artifacts.artifact_index` reads and writes it. Key layout::

    artifacts/<sandbox_id>/<path>                              the bytes ('/' kept, the rest URL-quoted)
    index/artifacts/by-sandbox/<sandbox_id>/<path>             one JSON entry per artifact
    index/artifacts/by-task/<task_id>/<sandbox_id>/<path>      the same entry, when the sandbox has a task_id
    index/artifacts/by-run/<run_id>/<sandbox_id>/<path>        the same entry, when it has labels.run_id

In index keys ``<path>`` is one segment (:func:`artifacts.trajectory.segment`, so '/' is quoted), and
listing artifacts by sandbox, task or run — or by run and sandbox — is one prefix listing. ``run_id``
is the sandbox's ``metadata.labels.run_id``: the label a rollout run puts on every sandbox it creates.
The ``by-sandbox`` entry is written last: it is what a fetch looks up, so it never names bytes that
are not stored yet.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import urllib.parse
from dataclasses import dataclass

from artifacts.trajectory import segment
from grove.core.artifact import Artifact
from grove.core.errors import BadRequest, Invalid

ARTIFACT_PREFIX = "artifacts/"
INDEX_PREFIX = "index/artifacts/"
RUN_LABEL = "run_id"
"""The metadata label that names a sandbox's rollout run."""


def normalize_path(path: str) -> str:
    """An artifact's path as recorded: absolute and normalized (``/workspace/out/x``)."""
    if not path or "\0" in path:
        raise Invalid("an artifact path must be non-empty and contain no NUL byte")
    return posixpath.normpath("/" + path.lstrip("/"))


def artifact_key(sandbox_id: str, path: str) -> str:
    """Where an artifact's bytes live in the bucket."""
    return f"{ARTIFACT_PREFIX}{sandbox_id}/" + urllib.parse.quote(path.lstrip("/"), safe="/._-")


def entry_keys(entry: Artifact) -> list[str]:
    """Every index key of the entry, ``by-sandbox`` last."""
    tail = f"{segment(entry.sandbox_id)}/{segment(entry.path)}"
    keys = [f"{INDEX_PREFIX}by-{name}/{segment(value)}/{tail}"
            for name, value in (("run", entry.run_id), ("task", entry.task_id)) if value]
    return [*keys, by_sandbox_key(entry.sandbox_id, entry.path)]


def by_sandbox_key(sandbox_id: str, path: str) -> str:
    """The key of an artifact's ``by-sandbox`` entry (what a fetch looks up)."""
    return f"{INDEX_PREFIX}by-sandbox/{segment(sandbox_id)}/{segment(path)}"


@dataclass(frozen=True)
class Query:
    """Which artifacts to list: every given field must match."""

    sandbox_id: str | None = None
    """Only this sandbox's."""
    task_id: str | None = None
    """Only those of sandboxes with this task."""
    run_id: str | None = None
    """Only those of sandboxes of this rollout run (``labels.run_id``)."""

    def prefix(self) -> str:
        """The narrowest index prefix holding every match (run, else task, else sandbox, else all)."""
        sandbox = f"{segment(self.sandbox_id)}/" if self.sandbox_id else ""
        if self.run_id:
            return f"{INDEX_PREFIX}by-run/{segment(self.run_id)}/{sandbox}"
        if self.task_id:
            return f"{INDEX_PREFIX}by-task/{segment(self.task_id)}/{sandbox}"
        return f"{INDEX_PREFIX}by-sandbox/{sandbox}"

    def matches(self, entry: Artifact) -> bool:
        """Whether the entry has every field given (the prefix covers only some of them)."""
        return all(want is None or have == want for want, have in (
            (self.sandbox_id, entry.sandbox_id), (self.task_id, entry.task_id), (self.run_id, entry.run_id)))


def page_token(last_key: str) -> str:
    """An opaque token that continues a listing after ``last_key``."""
    return base64.urlsafe_b64encode(last_key.encode()).decode().rstrip("=")


def after_key(token: str, prefix: str) -> str:
    """The index key a token continues after; BadRequest if it is not a token of this listing."""
    try:
        key = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        key = ""
    if not key.startswith(prefix):
        raise BadRequest("page_token is not a token of this listing (pass next_page_token back unchanged, "
                         "with the same filters)")
    return key
