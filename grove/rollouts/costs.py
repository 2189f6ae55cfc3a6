"""What an attempt's sandboxes cost: each one's figures as the router recorded them when it was deleted
(:class:`grove.core.cost.Cost`), added up per try here, and per variant, project and run in the report
(:func:`summarize`).

The router answers ``GET /v1/sandboxes/{id}`` for a sandbox it deleted too (while it remembers it: its last 10,000),
with the sandbox's ``cost`` and ``project``; one the router forgot (a restart) counts as a sandbox of unknown cost.
"""

from __future__ import annotations

from typing import Any

from grove.client import AsyncSandbox
from grove.core.cost import Cost, total
from grove.core.errors import GroveError


class Bill:
    """The sandboxes one try used — the agent's and every grader's — and what each cost."""

    def __init__(self) -> None:
        self.costs: list[Cost] = []
        self.unknown = 0
        """Sandboxes deleted whose cost the router did not tell."""
        self.project: str | None = None
        """The project the sandboxes belong to (the router key's)."""

    async def close(self, sandbox: AsyncSandbox) -> None:
        """Delete the sandbox (its errors raised as :meth:`AsyncSandbox.close` raises them), then read what it cost."""
        try:
            await sandbox.close()
        except BaseException:
            self.unknown += 1  # its TTL reaps it: what it cost is recorded in its trajectory only
            raise
        try:
            info = await sandbox.status()
        except GroveError:
            self.unknown += 1
            return
        cost = Cost.from_dict(info.get("cost"))
        if cost is None:
            self.unknown += 1
        else:
            self.costs.append(cost)
        if self.project is None and isinstance(project := info.get("project"), str):
            self.project = project

    def fields(self) -> dict[str, Any]:
        """What a result in ``results.jsonl`` carries of it: ``cost`` (the sandboxes' sum), ``cost_sandboxes`` (how
        many it sums), ``cost_unknown`` (how many it lacks, when any) and ``project``."""
        out: dict[str, Any] = {"cost": total(self.costs).to_dict(), "cost_sandboxes": len(self.costs)}
        if self.unknown:
            out["cost_unknown"] = self.unknown
        if self.project is not None:
            out["project"] = self.project
        return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost of some attempts: ``total`` (a :class:`Cost` as a dict), ``sandboxes`` it sums, ``unknown`` sandboxes
    (deleted but not told) and ``attempts_without`` a cost at all (results of a grove from before costs)."""
    costs = [c for r in results if (c := Cost.from_dict(r.get("cost"))) is not None]
    return {"total": total(costs).to_dict(),
            "sandboxes": sum(int(r.get("cost_sandboxes") or 0) for r in results),
            "unknown": sum(int(r.get("cost_unknown") or 0) for r in results),
            "attempts_without": len(results) - len(costs)}


def by_project(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`summarize` per project (the results' ``project``; ``?`` where a result names none)."""
    projects: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        projects.setdefault(str(r.get("project") or "?"), []).append(r)
    return {name: summarize(mine) for name, mine in sorted(projects.items())}
