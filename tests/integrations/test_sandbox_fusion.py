"""SandboxFusion's ``run_code`` served by a real router: driven by the real ``sandbox-fusion`` client and by
verl's own request shape (a plain ``requests.post`` of its JSON payload, memory limit included), each run in a
fresh sandbox claimed from the project's ``sandbox-fusion`` warm pool and recorded as a labelled trajectory."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from sandbox_fusion import RunCodeRequest, RunCodeResponse, RunStatus, run_code

from tests.support.router_fixtures import RouterProcess, wait_for

CPP_OK = '#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<"\\n";return 0;}\n'


def endpoint(router: RouterProcess, key: str | None = None) -> str:
    """The endpoint as a SandboxFusion user sets it: the key rides in the URL (the client sends no headers)."""
    return f"http://grove:{key or router.key}@127.0.0.1:{router.port}/sandbox-fusion"


def verl_call(router: RouterProcess, code: str, language: str, *, stdin: str = "", memory_limit_mb: int = 1024,
              run_timeout: float = 10, compile_timeout: float = 10) -> dict[str, Any]:
    """verl's ``call_sandbox_api``: its payload and headers, posted with ``requests`` to the full URL."""
    payload = json.dumps({"compile_timeout": compile_timeout, "run_timeout": run_timeout, "code": code,
                          "stdin": stdin, "memory_limit_MB": memory_limit_mb, "language": language, "files": {},
                          "fetch_files": []})
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    response = requests.post(endpoint(router) + "/run_code", headers=headers, data=payload, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.fixture(scope="module")
def pool(router: RouterProcess) -> Iterator[str]:
    """The project's ``sandbox-fusion`` pool, four warm sandboxes."""
    with router.client() as grove:
        grove.create_pool("sandbox-fusion", size=4, resources={"memory_mb": 512})
        wait_for(lambda: grove.pool("sandbox-fusion")["ready"] == 4, 120, what="pool ready")
        try:
            yield "sandbox-fusion"
        finally:
            grove.delete_pool("sandbox-fusion")


def test_python_with_files_through_the_client_in_a_pool_sandbox_recorded(router: RouterProcess, pool: str) -> None:
    code = "import sys\ndata = open('in/data.txt').read()\nprint(data.upper(), sys.stdin.read())\n" \
           "open('out.txt', 'w').write('made')\n"
    before = {s for s in router.live_ids()}
    answer = run_code(RunCodeRequest(code=code, language="python", stdin="from stdin",
                                     files={"in/data.txt": base64.b64encode(b"hello").decode()},
                                     fetch_files=["out.txt", "missing.txt"]),
                      endpoint=endpoint(router), max_attempts=1)
    assert isinstance(answer, RunCodeResponse) and answer.status == RunStatus.Success, answer
    assert answer.run_result is not None and answer.run_result.stdout == "HELLO from stdin\n"
    assert answer.run_result.return_code == 0 and answer.compile_result is None
    assert answer.files == {"out.txt": base64.b64encode(b"made").decode()}
    sandbox_id = answer.executor_pod_name
    assert sandbox_id and sandbox_id not in router.live_ids() and sandbox_id not in before  # used once, gone
    with router.client() as grove:
        assert grove.pool(pool)["claims"] >= 1
    reply = wait_for(lambda: (r := router.http("GET", f"/v1/trajectories/{sandbox_id}")).status == 200 and r, 30,
                     what="trajectory stored")
    record = reply.json()
    meta = record["sandbox"]
    assert meta["harness"] == "sandbox-fusion" and meta["task_id"].startswith("run_code-")
    assert meta["labels"]["language"] == "python" and len(meta["labels"]["code_sha256"]) == 64
    kinds = [(s["type"], s.get("path") or s.get("command")) for s in record["steps"] if s["type"] != "infra"]
    assert ("file_write", "/workspace/in/data.txt") in kinds and ("file_write", "/workspace/main.py") in kinds
    assert ("exec", "ulimit -v 1048576 && exec python3 main.py") not in kinds  # the client sends no limit
    assert ("exec", "exec python3 main.py") in kinds and ("file_read", "/workspace/out.txt") in kinds


def test_cpp_success_and_compile_error_in_verls_shape(router: RouterProcess, pool: str) -> None:
    ok = verl_call(router, CPP_OK, "cpp", stdin="2 40")
    assert ok["status"] == "Success" and ok["message"] == ""
    assert ok["compile_result"]["status"] == "Finished" and ok["compile_result"]["return_code"] == 0
    assert ok["run_result"] == {**ok["run_result"], "status": "Finished", "return_code": 0, "stdout": "42\n"}
    assert set(ok) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert set(ok["run_result"]) == {"status", "execution_time", "cpu_time", "return_code", "stdout", "stderr"}

    bad = verl_call(router, "int main( { return 0; }\n", "cpp")
    assert bad["status"] == "Failed" and bad["run_result"] is None
    assert bad["compile_result"]["status"] == "Finished" and bad["compile_result"]["return_code"] != 0
    assert "error" in bad["compile_result"]["stderr"]


def test_run_timeout_and_memory_over_the_limit(router: RouterProcess, pool: str) -> None:
    slow = verl_call(router, "import time\nprint('start', flush=True)\ntime.sleep(30)\n", "python", run_timeout=1)
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["stdout"] == "start\n" and slow["run_result"]["execution_time"] <= 1.0

    hog = verl_call(router, "x = bytearray(400 * 1024 * 1024)\nprint('allocated')\n", "python", memory_limit_mb=128)
    assert hog["status"] == "Failed" and hog["run_result"]["status"] == "Finished"
    assert hog["run_result"]["return_code"] != 0 and "MemoryError" in hog["run_result"]["stderr"]
    fits = verl_call(router, "x = bytearray(16 * 1024 * 1024)\nprint('allocated')\n", "python", memory_limit_mb=128)
    assert fits["status"] == "Success" and fits["run_result"]["stdout"] == "allocated\n"


def test_64_concurrent_requests_all_answered(router: RouterProcess, pool: str) -> None:
    def one(i: int) -> dict[str, Any]:
        return verl_call(router, f"print({i} * 2)\n", "python")

    with ThreadPoolExecutor(64) as workers:
        answers = list(workers.map(one, range(64)))
    assert [a["run_result"]["stdout"] for a in answers] == [f"{i * 2}\n" for i in range(64)]
    assert all(a["status"] == "Success" for a in answers)
    assert len({a["executor_pod_name"] for a in answers}) == 64  # never a sandbox twice


def test_bad_input_is_refused_with_a_clear_error(router: RouterProcess) -> None:
    url = endpoint(router) + "/run_code"
    wrong = requests.post(url, json={"code": "x", "language": "cobol"}, timeout=30)
    assert wrong.status_code == 422 and "cobol" in wrong.json()["error"]["message"]
    assert "python" in wrong.json()["error"]["message"]
    garbled = requests.post(url, json={"code": "x", "language": "python", "files": {"a": "**"}}, timeout=30)
    assert garbled.status_code == 422 and "base64" in garbled.json()["error"]["message"]
    unknown = requests.post(url, json={"code": "x", "language": "python", "colour": 1}, timeout=30)
    assert unknown.status_code == 400 and "colour" in unknown.json()["error"]["message"]
    refused = requests.post(endpoint(router, "not-a-key") + "/run_code", json={"code": "x", "language": "python"},
                            timeout=30)
    assert refused.status_code == 401
    bare = requests.post(f"{router.url}/sandbox-fusion/run_code", json={"code": "x", "language": "python"},
                         timeout=30)
    assert bare.status_code == 401
