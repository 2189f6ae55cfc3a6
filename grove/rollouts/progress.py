"""The live progress line on stderr: running, pass, fail, infra faults, harness errors, attempts/s, ETA; and what
happens that a person must know at once (a harness error, the router away), each on a line of its own."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts of a run, drawn as one line (redrawn in place on a terminal, every few seconds otherwise)."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.running = self.passed = self.failed = self.infra = self.lost = self.resumed = self.harness = 0
        self.remaining = 0
        self.started = time.monotonic()
        self._finished_here = 0
        self._last_line = 0.0
        self._tty = self.stream.isatty()

    def finished(self, outcome: str) -> None:
        """An attempt ended with ``outcome``."""
        self._finished_here += 1
        if outcome == "pass":
            self.passed += 1
        elif outcome == "fail":
            self.failed += 1
        elif outcome == "harness_error":
            self.harness += 1
        else:
            self.lost += 1

    def line(self) -> str:
        """The current line."""
        elapsed = max(1e-6, time.monotonic() - self.started)
        rate = self._finished_here / elapsed
        eta = f"{self.remaining / rate:5.0f}s" if rate > 0 and self.remaining else "    -"
        return (f"rollouts: running {self.running:3d}  pass {self.passed:4d}  fail {self.failed:4d}  "
                f"infra faults {self.infra:3d} (lost {self.lost})  harness errors {self.harness:3d}  "
                f"{rate:5.2f} attempts/s  ETA {eta}  "
                f"[{elapsed:5.0f}s]")

    def draw(self, *, force: bool = False) -> None:
        """Redraw (on a terminal), or print a line every 5 s (to a log)."""
        if self.quiet:
            return
        now = time.monotonic()
        if self._tty:
            self.stream.write("\r" + self.line())
        elif force or now - self._last_line >= 5:
            self.stream.write(self.line() + "\n")
        else:
            return
        self._last_line = now
        self.stream.flush()

    def say(self, message: str) -> None:
        """A message as it happens (a harness error, the router away), on its own line, even when quiet: a run
        must never fail silently."""
        if self._tty and not self.quiet:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"rollouts: {message}\n")
        self.stream.flush()
        self._last_line = 0.0

    def close(self) -> None:
        """The final line."""
        if self.quiet:
            return
        if self._tty:
            self.stream.write("\r" + self.line() + "\n")
        else:
            self.draw(force=True)
        self.stream.flush()
