"""Getting artifacts back out: list by sandbox, task and run; fetch with ranges and resume; verify; expire.

One router for the module, on the embedded S3 server, started with retention rules. Everything a test
checks it checks where a pipeline would: through the API, the SDK, the CLI, or in the router's bucket.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from artifacts import retention
from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from grove.client import Grove, Progress
from grove.core.errors import ChecksumMismatch, NotFound
from tests.support.router_fixtures import RouterProcess, error_of, router_state, wait_for

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def router() -> Iterator[RouterProcess]:
    """This module's router: artifacts kept 3 days, trajectories 30."""
    with router_state(start=False) as r:
        r.up_args = ("--artifact-retention-days", "3", "--trajectory-retention-days", "30")
        r.start()
        yield r


@pytest.fixture(scope="module")
def bucket(router: RouterProcess) -> Iterator[ObjectStore]:
    """The router's bucket, with its embedded server's credentials (grove's own, behind its back)."""
    state = json.loads((router.state_dir / "s3" / "grove-s3.json").read_text())
    store = ObjectStore(S3Config(endpoint=f"http://127.0.0.1:{state['ports']['s3.port']}",
                                 access_key=state["access_key"], secret_key=state["secret_key"]))
    yield store
    store.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pages(router: RouterProcess, route: str) -> list[list[dict[str, object]]]:
    """Every page of a listing, following next_page_token through raw HTTP."""
    out, token = [], None
    while True:
        sep = "&" if "?" in route else "?"
        reply = router.http("GET", route + (f"{sep}page_token={token}" if token else ""))
        assert reply.status == 200, reply.body
        body = reply.json()
        out.append(body["artifacts"])
        token = body["next_page_token"]
        if token is None:
            return out


def test_listing_by_sandbox_task_and_run_across_pages(router: RouterProcess, grove: Grove) -> None:
    run, task_a, task_b = f"run-{uuid.uuid4().hex[:8]}", f"ta-{uuid.uuid4().hex[:6]}", f"tb-{uuid.uuid4().hex[:6]}"
    sandboxes, written = {}, {}
    for name, task, labels in (("a", task_a, {"run_id": run}), ("b", task_b, {"run_id": run}), ("c", task_a, {})):
        sb = grove.create(heartbeat=False, metadata={"task_id": task, "labels": labels})
        sandboxes[name] = sb
        for i in range(3):
            data = f"{name}{i}".encode() * (i + 1)
            sb.write_file(f"out/f{i}.txt", data)
            written[(sb.id, f"/workspace/out/f{i}.txt")] = data
        pushed = sb.push_artifacts([f"out/f{i}.txt" for i in range(3)])
        assert [p["fetch"] for p in pushed] == [f"/v1/artifacts/{sb.id}/workspace/out/f{i}.txt" for i in range(3)]
    a, b, c = (sandboxes[n].id for n in "abc")

    by_run = pages(router, f"/v1/artifacts?run_id={run}&limit=2")
    assert [len(p) for p in by_run] == [2, 2, 2]
    flat = [e for p in by_run for e in p]
    assert {(e["sandbox_id"], e["path"]) for e in flat} == {k for k in written if k[0] in (a, b)}
    for e in flat:
        data = written[(e["sandbox_id"], e["path"])]
        assert e["size"] == len(data) and e["sha256"] == sha(data) and e["run_id"] == run
        assert e["key"] == f"artifacts/{e['sandbox_id']}/workspace/out/{Path(str(e['path'])).name}"
        assert isinstance(e["created_at"], float) and e["kind"] == "file"
    assert [(x.sandbox_id, x.path) for x in grove.artifacts.list(run_id=run, page_size=2)] == \
        [(e["sandbox_id"], e["path"]) for e in flat]

    by_task = [e for p in pages(router, f"/v1/artifacts?task_id={task_a}&limit=2") for e in p]
    assert {(e["sandbox_id"], e["path"]) for e in by_task} == {k for k in written if k[0] in (a, c)}
    # A filter the index prefix does not cover is applied entry by entry, across pages too.
    both = [e for p in pages(router, f"/v1/artifacts?run_id={run}&task_id={task_a}&limit=2") for e in p]
    assert {(e["sandbox_id"], e["path"]) for e in both} == {k for k in written if k[0] == a}
    by_sandbox = pages(router, f"/v1/sandboxes/{c}/artifacts?limit=2")
    assert [len(p) for p in by_sandbox] == [2, 1]
    assert [x.path for x in sandboxes["c"].artifacts(page_size=2)] == [f"/workspace/out/f{i}.txt" for i in range(3)]
    assert [x.path for x in grove.artifacts.list(sandbox_id=b)] == [f"/workspace/out/f{i}.txt" for i in range(3)]

    # Bad paging input is refused clearly.
    for query, status, needle in (("limit=0", 422, "limit"), ("limit=x", 400, "limit"),
                                  ("page_token=bm9wZQ", 400, "page_token"), ("color=red", 400, "color")):
        reply = router.http("GET", f"/v1/artifacts?run_id={run}&{query}")
        assert reply.status == status and needle in error_of(reply)["message"], (query, reply.body)

    # A deleted sandbox's artifacts are still listed; an unknown sandbox is a 404.
    sandboxes["a"].close()
    assert len(grove.artifacts.list(sandbox_id=a)) == 3
    assert len(router.http("GET", f"/v1/sandboxes/{a}/artifacts").json()["artifacts"]) == 3
    reply = router.http("GET", "/v1/sandboxes/sb-0123456789abcdef/artifacts")
    assert reply.status == 404 and "sb-0123456789abcdef" in error_of(reply)["message"]


def test_ranges_416_and_missing_artifacts(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False)
    # Any name a file can have is listed and fetched by its route.
    odd = "/workspace/odd dir/é #1?.txt"
    sb.write_file(odd, b"odd")
    sb.push_artifacts([odd])
    (listed,) = sb.artifacts()
    assert listed.path == odd and router.http("GET", router.http(
        "GET", f"/v1/sandboxes/{sb.id}/artifacts").json()["artifacts"][0]["fetch"]).body == b"odd"
    assert grove.artifacts.get(sb.id, odd) == b"odd"
    data = bytes(range(256)) * 4
    sb.write_file("r.bin", data)
    sb.push_artifacts(["r.bin"])
    route = f"/v1/artifacts/{sb.id}/workspace/r.bin"
    whole = router.http("GET", route)
    assert whole.status == 200 and whole.body == data and whole.headers["Accept-Ranges"] == "bytes"
    assert whole.headers["X-Grove-Sha256"] == sha(data) and whole.headers["X-Grove-Size"] == str(len(data))
    for header, start, end in (("bytes=10-19", 10, 19), ("bytes=1000-", 1000, 1023), ("bytes=-5", 1019, 1023),
                               ("bytes=1020-5000", 1020, 1023)):
        part = router.http("GET", route, headers={"Range": header})
        assert part.status == 206, (header, part.body)
        assert part.headers["Content-Range"] == f"bytes {start}-{end}/1024" and part.body == data[start:end + 1]
    # Several ranges, or a stale If-Range, get the whole object (as RFC 9110 allows).
    assert router.http("GET", route, headers={"Range": "bytes=0-1,5-6"}).body == data
    assert router.http("GET", route, headers={"Range": "bytes=5-", "If-Range": '"other"'}).status == 200
    fresh = router.http("GET", route, headers={"Range": "bytes=5-", "If-Range": whole.headers["ETag"]})
    assert fresh.status == 206 and fresh.body == data[5:]
    past = router.http("GET", route, headers={"Range": "bytes=1024-"})
    assert past.status == 416 and past.headers["Content-Range"] == "bytes */1024"
    assert error_of(past)["code"] == "range_not_satisfiable"

    missing = router.http("GET", f"/v1/artifacts/{sb.id}/workspace/nope.bin")
    assert missing.status == 404 and "/workspace/nope.bin" in error_of(missing)["message"]
    assert router.http("GET", "/v1/artifacts/sb-0123456789abcdef/workspace/r.bin").status == 404
    assert router.http("GET", f"/v1/artifacts/{sb.id}/workspace/nope.bin?redirect=1").status == 404
    # A path climbing out of the sandbox's artifacts reaches no other key of the bucket (trajectories, index).
    for sneaky in (f"{sb.id}/../../index/artifacts/by-sandbox/{sb.id}", f"{sb.id}/%2e%2e/%2e%2e/trajectories/x",
                   f"{sb.id}/workspace/../../../artifacts/{sb.id}/workspace/r.bin"):
        reply = router.http("GET", f"/v1/artifacts/{sneaky}")
        assert reply.status == 404 and reply.body != data, (sneaky, reply.status)
    with pytest.raises(NotFound):
        grove.artifacts.get(sb.id, "/workspace/nope.bin")


def test_a_truncated_output_is_listed_and_fetched_like_any_artifact(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False)
    result = sb.exec("head -c 2000000 /dev/zero | tr '\\0' 'z'", max_output_bytes=4096)
    assert result.stdout_truncated and result.stdout_file
    entry = wait_for(lambda: [a for a in sb.artifacts() if a.kind == "stdout"], timeout=30, what="the full output")[0]
    assert entry.path == result.stdout_file and entry.size == 2_000_000 and entry.sha256 == result.stdout_sha256
    step = grove.request("GET", f"/v1/sandboxes/{sb.id}/trajectory")["steps"][-1]
    assert step["stdout_artifact"] == entry.key
    assert grove.artifacts.get(sb.id, result.stdout_file) == b"z" * 2_000_000


def test_a_200_mb_artifact_fetched_with_a_range_then_resumed(router: RouterProcess, grove: Grove,
                                                               tmp_path: Path) -> None:
    sb = grove.create(heartbeat=False, disk_mb=1024)
    made = sb.exec("head -c 200M /dev/urandom > big.bin && sha256sum big.bin", timeout_s=120)
    assert made.exit_code == 0, made.stderr
    digest = made.stdout.split()[0].decode()
    started = time.monotonic()
    (pushed,) = sb.push_artifacts(["big.bin"])
    push_s = time.monotonic() - started
    assert pushed["size"] == 200 * MIB and pushed["sha256"] == digest
    route = f"/v1/artifacts/{sb.id}/workspace/big.bin"

    # The first 64 MiB with a range, as an interrupted download would have left them.
    resp, conn = router.send("GET", route, headers={"Range": f"bytes=0-{64 * MIB - 1}"}, timeout=120)
    try:
        assert resp.status == 206 and resp.headers["Content-Range"] == f"bytes 0-{64 * MIB - 1}/{200 * MIB}"
        assert int(resp.headers["Content-Length"]) == 64 * MIB
        dest = tmp_path / "big.bin"
        with open(dest.with_name("big.bin.part"), "wb") as out:
            while block := resp.read(MIB):
                out.write(block)
    finally:
        conn.close()
    assert dest.with_name("big.bin.part").stat().st_size == 64 * MIB

    events: list[Progress] = []
    started = time.monotonic()
    assert grove.artifacts.get(sb.id, "/workspace/big.bin", dest, progress=events.append) == dest
    resume_s = time.monotonic() - started
    assert events[0].event == "start" and events[0].resumed_from == 64 * MIB and events[-1].event == "done"
    assert not dest.with_name("big.bin.part").exists() and dest.stat().st_size == 200 * MIB
    with open(dest, "rb") as fh:
        assert hashlib.file_digest(fh, "sha256").hexdigest() == digest
    print(f"200 MiB: push {push_s:.1f}s, resume of the last 136 MiB {resume_s:.1f}s")


def test_a_tampered_object_is_refused_on_get_and_pull(router: RouterProcess, grove: Grove, bucket: ObjectStore,
                                                       tmp_path: Path) -> None:
    sb = grove.create(heartbeat=False)
    sb.write_file("model.bin", b"the real weights")
    sb.write_file("log.txt", b"fine\n")
    key = sb.push_artifacts(["model.bin", "log.txt"])[0]["key"]
    bucket.put_bytes(key, b"something else entirely")  # behind grove's back, with S3's own credentials
    recorded, tampered = sha(b"the real weights"), sha(b"something else entirely")

    with pytest.raises(ChecksumMismatch) as raised:
        grove.artifacts.get(sb.id, "/workspace/model.bin")
    assert recorded in raised.value.message and tampered in raised.value.message
    dest = tmp_path / "one" / "model.bin"
    with pytest.raises(ChecksumMismatch):
        grove.artifacts.get(sb.id, "/workspace/model.bin", dest)
    assert not dest.exists() and dest.with_name("model.bin.rejected").read_bytes() == b"something else entirely"

    out = tmp_path / "pulled"
    done = router.cli("artifacts", "pull", str(out), "--sandbox", sb.id)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "REFUSED" in stderr and "model.bin" in stderr and recorded in stderr and tampered in stderr, stderr
    assert not (out / sb.id / "workspace" / "model.bin").exists()
    assert (out / ".grove-rejected" / sb.id / "workspace" / "model.bin").read_bytes() == b"something else entirely"
    assert (out / sb.id / "workspace" / "log.txt").read_bytes() == b"fine\n"  # the others still complete
    got = router.cli("artifacts", "get", sb.id, "/workspace/model.bin", "-o", "-")
    assert got.returncode == 1 and got.stdout == b"" and recorded in got.stderr.decode()


def test_pull_by_run_resumes_and_skips_what_is_in_place(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    files = {}
    for _ in range(2):
        sb = grove.create(heartbeat=False, metadata={"labels": {"run_id": run}})
        for name, size in (("patch.diff", 3000), ("out/result.json", 200_000)):
            data = (f"{sb.id}:{name}:".encode() * size)[:size]
            sb.write_file(name, data)
            files[(sb.id, f"workspace/{name}")] = data
        sb.push_artifacts(["patch.diff", "out/result.json"])
    dest = tmp_path / "run"
    (first_sb, first_path), first = next(iter(files.items()))
    partial = dest / first_sb / f"{first_path}.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(first[: len(first) // 2])

    done = router.cli("artifacts", "pull", str(dest), "--run", run, "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert "resume" in done.stderr.decode() and f"pulled {len(files)} file(s)" in done.stderr.decode()
    for (sid, path), data in files.items():
        assert (dest / sid / path).read_bytes() == data
    assert not partial.exists()
    again = router.cli("artifacts", "pull", str(dest), "--run", run)
    assert again.returncode == 0
    assert f"pulled 0 file(s), 0.0 MiB received; {len(files)} already" in again.stderr.decode()
    listed = router.cli("artifacts", "ls", "--run", run)
    assert listed.returncode == 0 and listed.stdout.decode().count("patch.diff") == 2
    refused = router.cli("artifacts", "pull", str(dest))
    assert refused.returncode == 1 and "--run" in refused.stderr.decode()


def _refused(url: str) -> int | None:
    """The HTTP status S3 refuses a GET of ``url`` with; None while it still serves it."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code
    return None


def test_a_fresh_redirect_works_after_the_push_time_url_expired(router: RouterProcess, grove: Grove,
                                                                bucket: ObjectStore) -> None:
    sb = grove.create(heartbeat=False)
    sb.write_file("report.txt", b"all green\n")
    (pushed,) = sb.push_artifacts(["report.txt"], url_expires_s=1)
    # Fetched until S3 refuses it (once its second is over), rather than after a fixed sleep.
    assert wait_for(lambda: _refused(pushed["url"]), timeout=15, interval=0.1, what="the URL to expire") == 403
    reply = router.http("GET", f"/v1/artifacts/{sb.id}/workspace/report.txt?redirect=1&expires_s=60")
    assert reply.status == 307 and reply.headers["X-Grove-Sha256"] == sha(b"all green\n")
    location = reply.headers["Location"]
    assert "X-Amz-Expires=60" in location and bucket.config.secret_key not in location
    with urllib.request.urlopen(location, timeout=10) as resp:
        assert resp.read() == b"all green\n"
    with urllib.request.urlopen(grove.artifacts.url(sb.id, "/workspace/report.txt"), timeout=10) as resp:
        assert resp.read() == b"all green\n"


def test_the_lifecycle_rules_are_in_place(router: RouterProcess, bucket: ObjectStore) -> None:
    assert retention.read(bucket) == {
        "grove-artifacts": ("artifacts/", 3),
        "grove-artifact-index": ("index/artifacts/", 3),
        "grove-trajectories": ("trajectories/", 30),
        "grove-trajectory-index": ("index/by-", 30),
    }
    spec = router.http("GET", "/v1/openapi.json").json()["paths"]
    assert {"/v1/artifacts", "/v1/artifacts/{sandbox_id}/{path}"} <= set(spec)
    assert "get" in spec["/v1/sandboxes/{id}/artifacts"] and "post" in spec["/v1/sandboxes/{id}/artifacts"]
    names = {p["name"] for p in spec["/v1/artifacts"]["get"]["parameters"]}
    assert names == {"sandbox_id", "task_id", "run_id", "limit", "page_token"}
