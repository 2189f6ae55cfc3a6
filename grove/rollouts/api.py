"""The library entry points: run (or resume) a rollout run, write its reports, upload its files."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from grove.client import AsyncGrove
from grove.core.errors import GroveError
from grove.rollouts.report import FILES, write_reports
from grove.rollouts.runner import HarnessBroken, RunConfig, Runner


async def arun_rollouts(config: RunConfig) -> dict[str, Any]:
    """Run ``config`` to the end (resuming its run directory if it has one); the summary."""
    async with AsyncGrove(config.url, config.api_key) as client:
        runner = Runner(config, client)
        try:
            await runner.execute()
        except HarnessBroken:
            write_reports(config.out)  # what the run did until it stopped, for the reader of the error
            raise
        summary = write_reports(config.out)
        if config.upload:
            summary["uploaded"] = await upload_run(client, config.out, runner.run_id)
    return summary


def run_rollouts(config: RunConfig) -> dict[str, Any]:
    """Synchronous :func:`arun_rollouts`."""
    return asyncio.run(arun_rollouts(config))


async def upload_run(client: AsyncGrove, out: Path, run_id: str) -> list[str]:
    """Copy the run's files to S3 as ``runs/<run_id>/<name>`` (through the router); the keys stored.
    A failure is reported on stderr and leaves the local files as they are: they are the record."""
    keys = []
    names = [*FILES, "run.json", "journal.jsonl", *sorted(p.name for p in out.glob("*.png"))]
    for name in names:
        path = out / name
        if not path.exists():
            continue
        try:
            body = await client.request("PUT", f"/v1/runs/{run_id}/files/{name}", data=path.read_bytes(), retry=True)
        except GroveError as exc:
            print(f"rollouts: could not upload {name} to S3: {exc.message}", file=sys.stderr)
            continue
        keys.append(str(body["key"]))
    return keys
