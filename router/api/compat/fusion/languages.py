"""The languages ``run_code`` runs: where the source goes, how it is compiled and run.

The commands run under ``/bin/sh -c`` in the sandbox's working directory. They use what grove's ``default``
image has (it binds the host's ``/usr``: Python 3, GCC's ``g++``/``gcc``, Node.js on these machines); an
image with other toolchains is built offline with ``grove image build-debian`` and served by a warm pool (see
the README). The request's memory limit is an address-space limit (``ulimit -v``) on the program (not the
compiler, whose needs are grove's, not the submission's), which makes an allocation past it fail (Python's
``MemoryError``, C++'s ``bad_alloc``) instead of killing the sandbox. Node.js reserves more address space
than it uses, so its heap is capped with V8's own flag instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.errors import Invalid


@dataclass(frozen=True)
class Language:
    """One row of the table."""

    source: str
    """File the code is written to, relative to the working directory."""
    run: str
    """Shell command that runs the program (its first word the interpreter or binary)."""
    compile: str | None = None
    """Shell command that compiles it first (none: interpreted)."""
    heap_option: str | None = None
    """The interpreter's own heap limit in MiB (``--option=MiB`` after its name), used instead of ``ulimit -v``."""


LANGUAGES: dict[str, Language] = {
    "python": Language("main.py", "python3 main.py"),
    "cpp": Language("main.cpp", "./main", compile="g++ -std=c++17 -O2 -o main main.cpp"),
    "c": Language("main.c", "./main", compile="gcc -std=c11 -O2 -o main main.c -lm"),
    "bash": Language("main.sh", "bash main.sh"),
    "nodejs": Language("main.js", "node main.js", heap_option="--max-old-space-size"),
}


def language(name: str) -> Language:
    """The row for ``name``; ``Invalid`` naming the supported ones."""
    found = LANGUAGES.get(name)
    if found is None:
        raise Invalid(f"language {name!r} is not supported here; supported: {', '.join(sorted(LANGUAGES))} "
                      "(another toolchain needs an image that has it: see the README's SandboxFusion section)")
    return found


def shell(lang: Language, memory_mb: int) -> str:
    """The run command for ``/bin/sh -c``, its memory limited to ``memory_mb`` MiB (none if not positive)."""
    if memory_mb <= 0:
        return f"exec {lang.run}"
    if lang.heap_option is not None:
        program, _, rest = lang.run.partition(" ")
        return f"exec {program} {lang.heap_option}={memory_mb} {rest}"
    return f"ulimit -v {memory_mb * 1024} && exec {lang.run}"
