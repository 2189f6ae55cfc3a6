"""Pull many artifacts at once into ``<dest>/<sandbox_id>/<path>``: concurrent, resumable, verified.

Run again after an interruption, a pull skips the files already in place and verified, resumes the
``.part`` files it left, and fetches the rest. A file whose bytes do not hash to the recorded sha256 is
moved to ``<dest>/.grove-rejected/<sandbox_id>/<path>`` and reported; the others still complete.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grove.client.download import Progress, fetch_file, verified
from grove.core.artifact import Artifact
from grove.core.errors import ChecksumMismatch, GroveError, Invalid

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove

REJECTED = ".grove-rejected"


@dataclass
class PullReport:
    """What a pull did."""

    fetched: list[Path] = field(default_factory=list)
    """Files fetched (or finished) by this pull and verified."""
    skipped: list[Path] = field(default_factory=list)
    """Files that were already in place and verified."""
    bytes: int = 0
    """Bytes received by this pull."""
    rejected: list[ChecksumMismatch] = field(default_factory=list)
    """Files whose sha256 did not match the record (moved aside)."""
    failed: list[GroveError] = field(default_factory=list)
    """Files that could not be fetched (run the pull again to resume them)."""

    @property
    def ok(self) -> bool:
        """Every artifact is in place and verified."""
        return not self.rejected and not self.failed


def local_path(dest: Path, artifact: Artifact) -> Path:
    """Where a pull puts an artifact: ``<dest>/<sandbox_id>/<path>``, never outside ``dest``."""
    rel = posixpath.normpath("/" + artifact.path).lstrip("/")
    sandbox = artifact.sandbox_id
    if not rel or rel == "." or "/" in sandbox or sandbox in ("", ".", "..") or rel.startswith(REJECTED):
        raise Invalid(f"artifact {artifact.sandbox_id}:{artifact.path} has no safe local path")
    return dest / sandbox / rel


async def pull(
    client: AsyncGrove,
    artifacts: list[Artifact],
    dest: Path,
    *,
    jobs: int = 4,
    progress: Callable[[Progress], None] | None = None,
) -> PullReport:
    """Fetch ``artifacts`` into ``dest`` with ``jobs`` downloads at a time; see the module's docstring."""
    if jobs < 1:
        raise Invalid(f"jobs must be at least 1, got {jobs}")
    report = PullReport()
    gate = asyncio.Semaphore(jobs)

    async def one(art: Artifact) -> None:
        async with gate:
            try:
                target = local_path(dest, art)
                if await asyncio.to_thread(verified, target, art.size, art.sha256):
                    report.skipped.append(target)
                    if progress:
                        progress(Progress(art.route, art.size, art.size, art.size, "skipped"))
                    return
                reject_to = local_path(dest / REJECTED, art)
                report.bytes += await fetch_file(client, art.route, target, reject_to, (art.size, art.sha256),
                                                 progress)
                report.fetched.append(target)
            except ChecksumMismatch as exc:
                report.rejected.append(exc)
            except GroveError as exc:
                report.failed.append(type(exc)(f"{art.sandbox_id}:{art.path}: {exc.message}"))

    await asyncio.gather(*(one(a) for a in artifacts))
    return report
