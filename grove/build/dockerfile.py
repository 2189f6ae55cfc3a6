"""A Dockerfile as a build plan: its base and its steps, each with the line it came from and the build arguments
and environment in scope there. Parsing (continuations, quoting, ``ARG``/``ENV`` scoping, variable expansion) is
``dockerfile-parse``'s; this module only says which instructions grove builds, and refuses the others by line."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field

from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import WordSplitter

from grove.core.errors import Invalid

LAYER_STEPS = ("RUN", "COPY", "ADD", "WORKDIR")
"""Instructions that change the filesystem: each is a step run in a sandbox and committed as a layer."""
CONFIG_STEPS = ("ENV", "ARG", "USER", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "MAINTAINER")
"""Instructions that only change the image's config."""
_REFUSED = {
    "VOLUME": "a grove sandbox has one filesystem; drop the VOLUME line",
    "HEALTHCHECK": "grove checks an executor's health itself; drop the HEALTHCHECK line",
    "ONBUILD": "grove records no triggers for later builds; drop the ONBUILD line",
    "SHELL": "RUN steps run under /bin/sh -c; write the command for it (or use RUN's JSON form)",
    "STOPSIGNAL": "grove stops a sandbox by killing its process tree; drop the STOPSIGNAL line",
}


@dataclass(frozen=True)
class Step:
    """One instruction after ``FROM``."""

    line: int
    """Its first line in the Dockerfile (1-based)."""
    instruction: str
    """``RUN``, ``COPY``, ... (upper case)."""
    value: str
    """Everything after the instruction, continuations joined."""
    args: dict[str, str] = field(default_factory=dict)
    """Build arguments in scope, with their values."""
    envs: dict[str, str] = field(default_factory=dict)
    """``ENV`` variables in scope (this line's own included)."""
    line_envs: dict[str, str] = field(default_factory=dict)
    """What this line's ``ENV`` sets."""
    line_labels: dict[str, str] = field(default_factory=dict)
    """What this line's ``LABEL`` sets."""

    @property
    def where(self) -> str:
        """``line N: INSTRUCTION value`` for messages (shortened)."""
        text = f"{self.instruction} {self.value}"
        return f"line {self.line}: {text if len(text) <= 120 else text[:117] + '...'}"

    def words(self) -> list[str]:
        """The value split into words with ``$VAR``/``${VAR}`` expanded and quotes removed."""
        return list(WordSplitter(self.value, args=self.args, envs=self.envs).split(dequote=True))

    def json_form(self) -> list[str] | None:
        """The exec (JSON array) form of ``RUN``/``CMD``/``ENTRYPOINT``, or None for the shell form."""
        text = self.value.strip()
        if not text.startswith("["):
            return None
        try:
            parsed = json.loads(text)
        except ValueError:
            return None  # Docker runs a malformed array under the shell too
        if not isinstance(parsed, list) or not all(isinstance(w, str) for w in parsed):
            return None
        return parsed


@dataclass(frozen=True)
class Stage:
    """One ``FROM`` and the instructions after it, up to the next ``FROM``."""

    base: str
    """The ``FROM`` image (build arguments expanded), or the name of an earlier stage."""
    name: str | None
    """Its ``AS`` name (lower case), if any; ``COPY --from`` also takes its index."""
    steps: list[Step] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """What a Dockerfile builds: its stages, the last of which is the image."""

    base: str
    """The last stage's ``FROM``, build arguments expanded."""
    steps: list[Step]
    """The instructions after the last ``FROM``, in order."""
    digest: str
    """``sha256:`` of the Dockerfile's bytes."""
    stages: list[Stage] = field(default_factory=list)
    """Every stage in order (a single-stage Dockerfile: one, of ``base`` and ``steps``)."""

    def image_bases(self) -> list[str | None]:
        """Per stage, the image its ``FROM`` starts from, or None where the ``FROM`` names an earlier stage: by
        its ``AS`` name, which wins over an image of that name (Docker's rule; a ``FROM`` takes no stage index,
        only ``COPY --from`` does)."""
        names: set[str] = set()
        bases: list[str | None] = []
        for stage in self.stages:
            bases.append(None if stage.base.lower() in names else stage.base)
            if stage.name:
                names.add(stage.name)
        return bases


def _stage(line: int, value: str, global_args: dict[str, str], earlier: list[Stage]) -> Stage:
    """The stage a ``FROM`` line opens: ``FROM IMAGE [AS NAME]``, ARGs declared before the first FROM expanded."""
    words = list(WordSplitter(value, args=global_args).split(dequote=True))
    if any(w.startswith("--") for w in words) or len(words) not in (1, 3) or (
            len(words) == 3 and words[1].upper() != "AS"):
        raise Invalid(f"line {line}: FROM {value}: only `FROM IMAGE [AS NAME]` is supported")
    name = words[2].lower() if len(words) == 3 else None
    if name is not None and (name.isdigit() or name in {s.name for s in earlier}):
        raise Invalid(f"line {line}: FROM {value}: stage name {name!r} is "
                      f"{'a number' if name.isdigit() else 'taken by an earlier stage'}")
    return Stage(words[0], name)


def parse(text: bytes, build_args: dict[str, str]) -> Plan:
    """The plan of a Dockerfile (one stage or several); Invalid naming the line of anything grove does not build."""
    parser = DockerfileParser(fileobj=io.BytesIO(text), build_args=dict(build_args), env_replace=True)
    try:
        structure, contexts = parser.structure, parser.context_structure
    except Exception as exc:  # the parser raises bare ValueErrors and friends on malformed input
        raise Invalid(f"the Dockerfile cannot be parsed: {exc}") from None
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    for item, context in zip(structure, contexts, strict=True):
        instruction, line = str(item["instruction"]).upper(), int(item["startline"]) + 1
        value = str(item["value"])
        if instruction == "COMMENT":
            continue
        if instruction == "FROM":
            stages.append(_stage(line, value, global_args, stages))
            continue
        if instruction in _REFUSED:
            raise Invalid(f"line {line}: {instruction} is not supported by grove image build: {_REFUSED[instruction]}")
        if instruction not in LAYER_STEPS + CONFIG_STEPS:
            raise Invalid(f"line {line}: unknown instruction {instruction}")
        if not stages:
            if instruction == "ARG":
                global_args = dict(context.args)  # an ARG before FROM only feeds the FROM lines
                continue
            raise Invalid(f"line {line}: {instruction} before FROM; a Dockerfile starts with FROM (after ARGs)")
        stages[-1].steps.append(Step(line, instruction, value, dict(context.args), dict(context.envs),
                                     dict(context.line_envs), dict(context.line_labels)))
    if not stages or not stages[-1].base:
        raise Invalid("the Dockerfile has no FROM line")
    return Plan(stages[-1].base, stages[-1].steps, "sha256:" + hashlib.sha256(text).hexdigest(), stages)
