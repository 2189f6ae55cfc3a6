"""The Python SDK: ``AsyncGrove`` (aiohttp) and ``Grove`` (the same, driven from a background loop).

    from grove.client import Grove
    with Grove() as grove:                       # GROVE_URL and GROVE_API_KEY from the environment
        with grove.create(image="default", metadata={"task_id": "t1"}) as sb:
            print(sb.exec("python3 -c 'print(1+1)'").stdout)

Stored artifacts come back through ``grove.artifacts`` (``list``, ``get``, ``url``, ``pull``; by sandbox,
task or run, every fetch checked against the recorded sha256) and ``sandbox.artifacts()``.

``grove.create_many(n_or_bodies, ...)`` asks for many sandboxes in one call (``POST /v1/sandboxes/batch``);
if some fail, :class:`grove.core.errors.BatchFailed` carries the ones made, so none is lost with the error.

Errors come back as the router's own :mod:`grove.core.errors` classes. Create and exec carry a
``request_id``, so retrying them after a dropped connection never makes two sandboxes or runs a
command twice; nothing else is retried.
"""

from grove.client.aio import DEFAULT_URL, AsyncGrove, AsyncSandbox
from grove.client.download import Progress
from grove.client.pull import PullReport
from grove.client.results import ExecResult
from grove.client.sync import Grove, Sandbox
from grove.core.artifact import Artifact

__all__ = ["DEFAULT_URL", "Artifact", "AsyncGrove", "AsyncSandbox", "ExecResult", "Grove", "Progress", "PullReport",
           "Sandbox"]
