"""Issue 18, findings 1 and 7: the router never stores or vouches for what the sandbox could have swapped.

1. A command renames a 2 GB sparse file over its own spill file: the router stores the bytes the command
   wrote (read from the executor's descriptor, capped at the reported size, sha256 checked), and the S3
   data dir grows by about that much, not by 2 GB.
2. A process in the sandbox listening on the S3 port answers the executor's presigned PUT with 200: the
   push is relayed by the router (or reported failed), never ``uploaded`` for an object that is missing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from artifacts.store import ObjectStore
from grove.client import Grove
from tests.router.test_record import s3_of
from tests.support.router_fixtures import RouterProcess, wait_for

# Measures its router's embedded S3 data dir.
pytestmark = pytest.mark.embedded_s3


@pytest.fixture(scope="module")
def bucket(router: RouterProcess) -> Iterator[ObjectStore]:
    """The router's own bucket, read with its credentials."""
    store = ObjectStore(s3_of(router)[0])
    yield store
    store.close()


def _exec_step(grove: Grove, sandbox_id: str) -> dict[str, object]:
    """The last exec step (a ``full_output`` step may already follow it: the store runs in the background)."""
    steps = grove.request("GET", f"/v1/sandboxes/{sandbox_id}/trajectory")["steps"]
    return next(s for s in reversed(steps) if s["type"] == "exec")


def _du(path: Path) -> int:
    """Bytes the files under ``path`` really take on disk (sparse holes cost nothing)."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_swapped_spill_file_is_not_relayed(router: RouterProcess, grove: Grove, bucket: ObjectStore) -> None:
    sandbox = grove.create(heartbeat=False, disk_mb=128)
    data_dir = router.state_dir / "s3"
    before = _du(data_dir)
    result = sandbox.exec(["sh", "-c", "truncate -s 2G /tmp/big; head -c 2000000 /dev/zero; sleep 0.5; "
                           "for f in /tmp/grove-output/*.stdout; do mv /tmp/big $f; done"], max_output_bytes=4096)
    assert result.stdout_truncated and result.stdout_bytes == 2_000_000
    key = _exec_step(grove, sandbox.id)["stdout_artifact"]
    wait_for(lambda: bucket.exists(key), timeout=30, what="the full output in S3")
    time.sleep(2)  # a relay of the swapped file would still be writing
    stored = bucket.get_bytes(key)
    assert len(stored) == 2_000_000 and hashlib.sha256(stored).hexdigest() == result.stdout_sha256
    grown = _du(data_dir) - before
    assert grown < 40 * 1024 * 1024, f"the S3 data dir grew by {grown} bytes for a 2 MB output"
    # The swapped path is still what the sandbox sees; the router did not read it.
    assert sandbox.exec(["sh", "-c", "stat -c %s /tmp/grove-output/*.stdout"]).stdout.strip() == b"2147483648"
    sandbox.close()


def test_a_rewritten_spill_file_is_recorded_not_stored(router: RouterProcess, grove: Grove,
                                                       bucket: ObjectStore) -> None:
    """The inode itself stays writable to root in the sandbox: a changed output is a recorded mismatch."""
    sandbox = grove.create(heartbeat=False)
    result = sandbox.exec(["sh", "-c", "head -c 300000 /dev/zero; sleep 0.3; "
                           "for f in /tmp/grove-output/*.stdout; do printf x | dd of=$f conv=notrunc 2>/dev/null; "
                           "done"], max_output_bytes=4096)
    assert result.stdout_truncated
    key = _exec_step(grove, sandbox.id)["stdout_artifact"]

    def mismatch() -> dict[str, object] | None:
        found = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"]
        return next((s for s in found if s.get("type") == "full_output"), None)

    noted = wait_for(mismatch, timeout=30, what="the mismatch in the trajectory")
    assert noted["stored"] is False and "sha256" in str(noted["error"]) and noted["path"] == result.stdout_file
    assert not bucket.exists(key)
    sandbox.close()


def test_a_listener_on_the_s3_port_does_not_fake_an_upload(router: RouterProcess, grove: Grove,
                                                          bucket: ObjectStore) -> None:
    sandbox = grove.create(heartbeat=False)
    port = urlsplit(s3_of(router)[0].endpoint).port
    fake = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_PUT(self):\n"
        "        self.rfile.read(int(self.headers.get('Content-Length') or 0))\n"
        "        self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    sandbox.write_file("/tmp/fake_s3.py", fake.encode())
    sandbox.exec(["sh", "-c", "python3 /tmp/fake_s3.py >/dev/null 2>&1 &"])
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}))"
    wait_for(lambda: sandbox.exec(["python3", "-c", probe]).exit_code == 0, timeout=10, what="the fake S3 listener")
    payload = b"the real artifact\n" * 1000
    sandbox.write_file("/workspace/out.bin", payload)
    item = grove.request("POST", f"/v1/sandboxes/{sandbox.id}/artifacts", json_body={"paths": ["out.bin"]})
    item = item["artifacts"][0]
    assert item["uploaded"] is True, item
    assert bucket.exists(item["key"]), f"reported uploaded via {item['via']} but the object is missing"
    assert bucket.get_bytes(item["key"]) == payload and item["sha256"] == hashlib.sha256(payload).hexdigest()
    sandbox.close()
