"""The checkpoint API's request models (the OpenAPI document is generated from them)."""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.schema import spec
from router.checkpoints.service import MAX_FORK
from router.models import Metadata


@dataclass(frozen=True)
class ForkRequest:
    """Fork a sandbox: N new sandboxes with its files as they are now; it keeps running."""

    count: int = spec(f"how many sandboxes to make (1 to {MAX_FORK})", default=1, minimum=1, maximum=MAX_FORK)
    metadata: Metadata | None = spec("the children's metadata (default: the parent's)", default=None)
    memory: bool = spec("carry the processes too (CRIU); refused: this host's kernel cannot checkpoint processes, "
                        "so forks carry files only", default=False)
