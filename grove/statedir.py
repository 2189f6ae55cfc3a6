"""The one description of a router's state dir: where each of its files and folders lives.

The router, the CLI, the tests and the benchmarks all name paths through :class:`StateDir`, so the
layout is spelled once::

    <state>/api_keys                    API keys (0600), one per line: KEY [label]
    <state>/router.json                 the running router's PID and URL (grove.runfile)
    <state>/router.log                  the router's output when a harness starts it
    <state>/records/<id>.json           one record per sandbox (re-adoption after a restart)
    <state>/pools/<name>.json           one warm pool definition per file (kept across restarts)
    <state>/projects/<name>.json        one project per file: its quotas and retention
    <state>/journals/<id>.msgpack       each sandbox's trajectory steps, appended as they happen
    <state>/activity.json               each sandbox's last API call or heartbeat (across restarts)
    <state>/spool/                      trajectories waiting for S3
    <state>/s3/                         the embedded S3 server's data (grove-s3.pid, grove-s3.json)
    <state>/images/                     the local backend's images
    <state>/runtime/                    the runtime bundle injected into every sandbox
    <state>/disk-templates/             per-size templates of sandbox disk images
    <state>/sandboxes/<id>/             a local sandbox's own files (writable layer, executor socket)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grove.core.errors import Invalid
from grove.core.sandbox_ids import LONGEST_ID

SUN_PATH_MAX = 107
"""The longest Unix socket path Linux takes (``sun_path`` is 108 bytes, with the NUL)."""
_SOCKET_TAIL = len(f"/sandboxes/{LONGEST_ID}/executor.sock")


@dataclass(frozen=True)
class StateDir:
    """Paths inside one state dir."""

    root: Path

    def make_private(self) -> None:
        """Create the state dir if missing and make it its owner's alone (0700), also if it was made open before.

        It holds what no other user of the host may reach: API keys, records with the sandboxes' tokens and
        env, their disks, every image's files (an image's setuid-root program runs as root for whoever can
        reach it: inside a sandbox its user namespace makes it harmless, on the host it is not) and the
        embedded S3 server's data. One closed door at the top keeps all of it out of reach, whatever modes
        the files under it have (images keep theirs: ``sudo`` in a task image needs its setuid bit).
        """
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def check_socket_room(self) -> None:
        """Refuse (:class:`Invalid`) a state dir too long a path for its local sandboxes' executor sockets.

        Each local sandbox listens on ``<state>/sandboxes/<id>/executor.sock``; past :data:`SUN_PATH_MAX` bytes
        every start would fail with "AF_UNIX path too long", so the router says so once, before it starts.
        """
        room = SUN_PATH_MAX - _SOCKET_TAIL
        length = len(os.fsencode(self.root.resolve()))
        if length > room:
            raise Invalid(f"the state dir {self.root.resolve()} is too long a path for the Unix sockets of the "
                          f"sandboxes under it ({length} bytes, at most {room}); choose a shorter --state-dir")

    @property
    def api_keys(self) -> Path:
        """The API key file."""
        return self.root / "api_keys"

    @property
    def run_file(self) -> Path:
        """Which router serves this state dir (written while it runs)."""
        return self.root / "router.json"

    @property
    def log(self) -> Path:
        """The router's output, where a harness (tests, benchmarks, ``grove down``) sends it."""
        return self.root / "router.log"

    @property
    def records(self) -> Path:
        """One JSON record per sandbox."""
        return self.root / "records"

    @property
    def pools(self) -> Path:
        """One JSON warm-pool definition per pool."""
        return self.root / "pools"

    @property
    def projects(self) -> Path:
        """Project definitions: quotas and retention, one JSON file each."""
        return self.root / "projects"

    def record(self, sandbox_id: str) -> Path:
        """A sandbox's record."""
        return self.records / f"{sandbox_id}.json"

    @property
    def journals(self) -> Path:
        """Trajectory journals."""
        return self.root / "journals"

    def journal(self, sandbox_id: str) -> Path:
        """A sandbox's journal."""
        return self.journals / f"{sandbox_id}.msgpack"

    @property
    def activity(self) -> Path:
        """Each sandbox's last API call or heartbeat, written every few seconds (kept across restarts)."""
        return self.root / "activity.json"

    @property
    def spool(self) -> Path:
        """Trajectories waiting for S3."""
        return self.root / "spool"

    @property
    def s3(self) -> Path:
        """The embedded S3 server's data dir."""
        return self.root / "s3"

    @property
    def images(self) -> Path:
        """The local image store."""
        return self.root / "images"

    @property
    def runtime(self) -> Path:
        """The runtime bundle."""
        return self.root / "runtime"

    @property
    def disk_templates(self) -> Path:
        """Templates of sandbox disk images, one per size."""
        return self.root / "disk-templates"

    @property
    def sandboxes(self) -> Path:
        """Local sandboxes' own directories."""
        return self.root / "sandboxes"

    def sandbox(self, sandbox_id: str) -> Path:
        """A local sandbox's directory."""
        return self.sandboxes / sandbox_id
