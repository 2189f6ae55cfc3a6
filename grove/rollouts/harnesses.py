"""Harnesses: what acts in an attempt's sandbox between setup and grading.

``--harness`` takes ``scripted`` (the demo's stochastic agent, :mod:`grove.rollouts.scripted`),
``mini-swe-agent`` (its real ``DefaultAgent`` loop, every command run by
:class:`grove.integrations.minisweagent.GroveEnvironment` in the attempt's sandbox), or
``module:function`` — any callable ``function(task: dict, sandbox: grove.Sandbox) -> None``. One that also takes
``resume=`` (a :class:`grove.rollouts.resume.Prefix`) can continue a recorded attempt from its step k, which
progress runs need; scripted and mini-swe-agent can.

A harness runs in a worker thread with a synchronous :class:`grove.Sandbox`. The ``task`` dict is the
task's line plus ``id``, ``prompt``, ``workdir``, ``attempt``, ``group_id``, ``run_id`` and ``model``.
Three kinds of failure, kept apart:

- :class:`InfraFault`: the environment failed, not the policy (the attempt is retried in a fresh sandbox and
  never scored).
- :class:`PolicyError`: the policy owns the failure (a malformed tool call, an answer that cannot be parsed,
  no answer in time): the agent's turn ends and the check decides, as for an agent that gave up. Returning
  early does the same. Dropping such attempts instead would bias the groups toward the policy's good days.
- Any other exception is the harness's own bug: the attempt's outcome is ``harness_error``, with the traceback
  in its results and its trajectory, said on stderr as it happens, never scored; a run whose harness keeps
  failing stops early (``--max-harness-errors``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.client import Sandbox
from grove.core.errors import GroveError, Invalid
from grove.rollouts.hooks import resolve_function
from grove.rollouts.resume import Prefix

HarnessFn = Callable[..., None]
"""``function(task, sandbox)``, or ``function(task, sandbox, resume=None)`` for one that can resume
(:mod:`grove.rollouts.resume`)."""
DETERMINISTIC = "deterministic"


class InfraFault(GroveError):
    """Raised by a harness: the environment failed (not the policy); the attempt is retried, never scored."""

    code = "infra_fault"
    status = 503

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        """A short name for reports (e.g. ``executor_lost``); the class's code when None."""


class PolicyError(Exception):
    """Raised by a harness: the policy failed in a way it owns (a malformed tool call, an unparseable answer).
    The agent's turn ends and the check decides: the attempt is scored."""


@dataclass(frozen=True)
class Harness:
    """A resolved ``--harness`` (with its ``--model``)."""

    name: str
    version: str
    model: str | None
    run: HarnessFn

    @property
    def label(self) -> str:
        """How reports name this variant."""
        return f"{self.name} / {self.model}" if self.model else self.name


def resolve(spec: str, model: str | None) -> Harness:
    """The harness a ``--harness`` value names."""
    if spec == "scripted":
        from grove.rollouts.scripted import run_scripted

        return Harness("scripted", _version("grove"), model or "scripted-policy", run_scripted)
    if spec == "mini-swe-agent":
        try:
            version = _version("mini-swe-agent")
        except Invalid as exc:
            raise Invalid("--harness mini-swe-agent needs the mini-swe-agent package installed") from exc
        chosen = model or DETERMINISTIC
        return Harness("mini-swe-agent", version, chosen, functools.partial(run_mini, model=chosen))
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise Invalid(f"--harness {spec!r}: use scripted, mini-swe-agent, or module:function")
    fn = resolve_function(spec, "--harness")
    module = sys.modules[module_name]
    version = str(getattr(module, "__version__", None) or _package_version(module_name))
    return Harness(spec, version, model, fn)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise Invalid(f"package {package!r} is not installed") from exc


def _package_version(module_name: str) -> str:
    try:
        return importlib.metadata.version(module_name.split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return "unversioned"


def run_mini(task: dict[str, Any], sandbox: Sandbox, model: str, resume: Prefix | None = None) -> None:
    """mini-swe-agent's ``DefaultAgent`` on the task: its deterministic model (replies scripted from the
    task's ``scripted`` policy), a model config file (YAML with a ``model`` section), or a model name; with
    ``resume``, continuing the recorded conversation (:class:`grove.integrations.miniresume.ResumedAgent`)."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec

    from grove.integrations.minisweagent import GroveEnvironment

    config = get_config_from_spec("default.yaml")
    env = GroveEnvironment(sandbox=sandbox, cwd=str(task.get("workdir") or ""), timeout=60)
    options = {**config["agent"], "step_limit": 30}
    if resume is None:
        agent = DefaultAgent(_mini_model(task, model), env, **options)
    else:
        from grove.integrations.miniresume import ResumedAgent

        agent = ResumedAgent(_mini_model(task, model), env, resume=resume, **options)
    agent.run(str(task["prompt"]))


def _mini_model(task: dict[str, Any], model: str) -> Any:
    if model == DETERMINISTIC:
        from minisweagent.models.test_models import DeterministicModel

        return DeterministicModel(outputs=deterministic_outputs(task), model_name=DETERMINISTIC)  # type: ignore[no-untyped-call]
    from minisweagent.models import get_model

    if model.endswith((".yaml", ".yml")):
        import yaml

        spec = yaml.safe_load(Path(model).read_text()) or {}
        return get_model(config=spec.get("model", spec))
    return get_model(model)


def deterministic_outputs(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The deterministic model's replies for a task: its scripted policy as shell commands, then submit."""
    from minisweagent.models.test_models import make_output

    from grove.rollouts.scripted import draws_right

    policy = task.get("scripted") or {}
    outputs = [make_output("THOUGHT: I look around first.", [{"command": c}]) for c in policy.get("inspect", [])]
    edit = policy.get("edit")
    if edit:
        right = draws_right(str(task["id"]), int(task.get("attempt", 0)), float(policy.get("p_solve", 1.0)),
                            int(policy.get("seed", 0)))
        fix = edit["right"] if right else edit.get("wrong")
        if fix is not None:
            patch = (f"python3 - <<'EOF'\nimport pathlib\np = pathlib.Path({edit['path']!r})\n"
                     f"p.write_text(p.read_text().replace({edit['find']!r}, {fix!r}))\nEOF")
            outputs.append(make_output(f"THOUGHT: I replace `{edit['find'].strip()}` with `{fix.strip()}`.",
                                       [{"command": patch}]))
    outputs += [make_output("THOUGHT: Check again.", [{"command": c}]) for c in policy.get("verify", [])]
    done = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    if edit:
        done += f" && cat {shlex.quote(edit['path'])}"
    outputs.append(make_output("THOUGHT: Done; submitting.", [{"command": done}]))
    return outputs
