"""Every Python example in README.md runs, as written, against a real router.

Each ```python block is taken from the README text itself (nothing copied here), given what its prose
assumes (``GROVE_URL``/``GROVE_API_KEY`` exported, a ``./project`` directory, a task and a policy, a model,
a sandbox id), executed, and then checked for what it promises. A new block fails until it is taught here
what it assumes — so no example can rot unnoticed.
"""

from __future__ import annotations

import ast
import asyncio
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.models.test_models import DeterministicModel, make_output
from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

from grove import Grove
from grove.client import AsyncGrove
from grove.client.aio import AsyncSandbox
from grove.core.errors import GroveError
from grove.integrations.minisweagent import GroveEnvironment
from tests.support.readme import python_blocks, readme_block
from tests.support.router_fixtures import RouterProcess, wait_for
from tests.support.sandbox_servers import drop_libs_dirs, start_interpreter


def run_block(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute one block (top-level ``await`` allowed, as in an asyncio REPL) in ``namespace``."""
    compiled = compile(code, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    return namespace


async def run_block_async(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_block` inside a running event loop (for blocks using an ``AsyncGrove`` made there)."""
    result = eval(compile(code, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), namespace)
    if asyncio.iscoroutine(result):
        await result
    return namespace


@pytest.fixture
def user(router: RouterProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RouterProcess:
    """A user's shell: the router exported, working in a fresh directory."""
    monkeypatch.setenv("GROVE_URL", router.url)
    monkeypatch.setenv("GROVE_API_KEY", router.key)
    monkeypatch.chdir(tmp_path)
    return router


def block(marker: str) -> str:
    """The one README block that contains ``marker``."""
    return readme_block(marker)


MARKERS = {
    "quickstart": 'sb.write_file("/workspace/x.py"',
    "harness": "def rollout(task, policy):",
    "mini": "env = GroveEnvironment(",
    "swerex": "rt = RemoteRuntime(",
    "e2b": 'sbx = Sandbox.create("base", timeout=300',
    "e2b_interpreter": 'ex = sbx.run_code("x = 41; print(\'hi\'); x + 1")',
    "fusion": "answer = run_code(RunCodeRequest(",
    "artifacts": 'grove.artifacts.pull("./out", run_id="run-7")',
    "many": 'grove.create_many(n, pool="swe"',
    "as_ready": "async for i, sandbox in grove.create_as_ready(",
    "in_parts": "async for part in grove.create_in_parts(",
    "computer": 'sb.computer.start(browser="http://127.0.0.1:8000/")',
    # Run on a real GUI trajectory's export by tests/artifacts/test_export_multimodal.py.
    "gui_sft": 'ds = ds.cast_column("images", List(Image()))',
    # Run on a real progress run's credit export by tests/replay/test_credit.py.
    "credit_sft": 'ds = load_dataset("json", data_files="credit.jsonl"',
    "processes": 'job = sb.processes.start("for i in 1 2 3',
    "ports": 'sb.exec("setsid python3 -m http.server 8000 --bind 127.0.0.1',
    "checkpoints": "cp = sandbox.checkpoint()",
}


def test_every_python_block_is_run_by_a_test() -> None:
    untaught = [code.splitlines()[0] for code in python_blocks() if not any(m in code for m in MARKERS.values())]
    assert untaught == [], f"README Python blocks no test runs: {untaught}"


def test_computer_use(user: RouterProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block as written (its site not up: Chromium shows its own error page, the calls work the same)."""
    with Grove(user.url, user.key) as grove:
        namespace = run_block(block(MARKERS["computer"]), {"grove": grove})
        sandbox = namespace["sb"]
        try:
            shot = namespace["shot"]
            assert (shot.width, shot.height) == (1280, 800) and shot.cursor == (640, 400)
            assert (tmp_path / "after.png").read_bytes() == shot.png
            assert "(640, 400)" in capsys.readouterr().out
            recorded = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"]
            assert [s["action"] for s in recorded if s["type"] == "computer"] == [
                "left_click", "type", "key", "scroll", "left_click_drag"]
        finally:
            sandbox.close()


def test_quickstart(user: RouterProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("print('from the project')\n")
    before = user.live_ids()
    run_block(block(MARKERS["quickstart"]), {})
    assert capsys.readouterr().out == "0 hi\n\n"  # result.text keeps the command's own newline
    assert (tmp_path / "out" / "main.py").read_text() == "print('from the project')\n"
    assert user.live_ids() == before  # leaving the `with` deleted it


@dataclass
class Action:
    text: str
    command: str = ""
    done: bool = False


@dataclass
class Policy:
    name: str = "readme-policy"
    script: list[Action] = field(default_factory=lambda: [
        Action("look", "ls"), Action("fix", "echo 'x = 1' > fix.py"), Action("done", done=True)])

    def act(self, observation: str) -> Action:
        return self.script.pop(0)


@dataclass
class Task:
    id: str
    repo_dir: str
    image: str = "default"
    prompt: str = "make fix.py define x"
    max_steps: int = 5
    test_command: str = "python3 -c 'import fix; assert fix.x == 1'"


def test_wiring_any_harness(user: RouterProcess, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("a task\n")
    namespace = run_block(block(MARKERS["harness"]), {})
    namespace["rollout"](Task(id="readme-harness", repo_dir=str(repo)), Policy())
    with Grove(user.url, user.key) as grove:
        stored = grove.request("GET", "/v1/trajectories", params={"task_id": "readme-harness"})["trajectories"]
        record = grove.request("GET", f"/v1/trajectories/{stored[0]['sandbox_id']}")
    assert record["outcome"]["result"] == "pass" and record["outcome"]["reward"] == 1.0
    assert record["sandbox"]["harness"] == "my-harness"


def test_mini_swe_agent(user: RouterProcess) -> None:
    outputs = [make_output("THOUGHT: done.", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}])]
    namespace: dict[str, Any] = {
        "GroveEnvironment": GroveEnvironment,
        "DefaultAgent": DefaultAgent,
        "model": DeterministicModel(outputs=outputs),
        "config": {"agent": {**get_config_from_spec("default.yaml")["agent"], "step_limit": 3}},
        "task": "Say you are done.",
    }
    run_block(block(MARKERS["mini"]), namespace)
    env = namespace["env"]
    assert env.sandbox.id not in user.live_ids()
    with Grove(user.url, user.key) as grove:
        record = grove.request("GET", f"/v1/trajectories/{env.sandbox.id}")
    assert record["outcome"]["result"] == "pass" and record["sandbox"]["task_id"] == "django-11099"


def test_swerex_remote_runtime(user: RouterProcess) -> None:
    with Grove(user.url, user.key) as grove, grove.create(heartbeat=False) as sb:
        namespace: dict[str, Any] = {
            "GROVE_URL": user.url, "GROVE_API_KEY": user.key, "sandbox_id": sb.id,
            "CreateBashSessionRequest": CreateBashSessionRequest, "BashAction": BashAction,
        }
        sb.write_file("/workspace/test_ok.py", "def test_ok():\n    assert True\n")
        run_block(block(MARKERS["swerex"]).replace("pytest -q", "python3 -c 'print(1)'"), namespace)
        steps = grove.request("GET", f"/v1/sandboxes/{sb.id}/trajectory")["steps"]
    assert any(s.get("via") == "swerex" and s["type"] == "exec" for s in steps), steps


def test_e2b_sdk(user: RouterProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block as written, with the environment the README exports."""
    monkeypatch.setenv("E2B_API_URL", f"{user.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{user.url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", user.key)
    monkeypatch.setenv("E2B_HTTP_VERSION", "1.1")
    before = user.live_ids()
    namespace = run_block(block(MARKERS["e2b"]), {})
    sandbox_id = namespace["sbx"].sandbox_id
    assert sandbox_id not in user.live_ids() and user.live_ids() == before  # killed
    steps = user.http("GET", f"/v1/trajectories/{sandbox_id}").json()["steps"]
    assert ["/bin/bash", "-l", "-c", "ls /workspace"] in [s.get("command") for s in steps]


def test_e2b_code_interpreter(user: RouterProcess, e2b_env: None) -> None:
    """The block as written, on a sandbox whose server grove's tests started."""
    try:
        with user.client() as client:
            sandbox = client.create(heartbeat=False)
            start_interpreter(sandbox)
        namespace = run_block(block(MARKERS["e2b_interpreter"]), {"sandbox_id": sandbox.id})
    finally:
        drop_libs_dirs()
    assert namespace["ex"].text == "42" and namespace["ex"].logs.stdout == ["hi\n"]
    assert namespace["error"].name == "ZeroDivisionError"


def test_sandbox_fusion_client(user: RouterProcess) -> None:
    namespace = run_block(block(MARKERS["fusion"]), {"GROVE_URL": user.url, "GROVE_API_KEY": user.key})
    answer = namespace["answer"]
    assert answer.status == "Success" and answer.run_result.stdout == "1\n"


def test_getting_artifacts_back(user: RouterProcess, tmp_path: Path) -> None:
    namespace = run_block(block(MARKERS["artifacts"]), {})
    sandbox_id = namespace["sb"].id
    assert sandbox_id not in user.live_ids()
    assert [a.path for a in namespace["mine"]] == ["/workspace/out/answer.txt"]
    assert [a.sandbox_id for a in namespace["arts"]] == [sandbox_id] and namespace["data"] == b"42\n"
    assert (tmp_path / "answer.txt").read_bytes() == b"42\n"
    assert namespace["report"].ok and len(namespace["report"].fetched) == 1
    assert (tmp_path / "out" / sandbox_id / "workspace" / "out" / "answer.txt").read_bytes() == b"42\n"
    with urllib.request.urlopen(namespace["url"], timeout=10) as resp:
        assert resp.read() == b"42\n"


def test_many_at_once(user: RouterProcess) -> None:
    """The batch example, at a test's scale: 3 sandboxes from a pool of 2 (two claims, one fresh start), and
    the same call again (a retry after a timeout, say) returns the same sandboxes, making none."""
    with Grove(user.url, user.key) as grove:
        grove.create_pool("swe", size=2, resources={"cpu": 0.5, "memory_mb": 256})
        try:
            deadline = time.monotonic() + 60
            while grove.pool("swe")["ready"] < 2:
                assert time.monotonic() < deadline, grove.pool("swe")
                time.sleep(0.2)
            first = run_block(block(MARKERS["many"]), {"grove": grove, "n": 3, "step": 7})["sandboxes"]
            again = run_block(block(MARKERS["many"]), {"grove": grove, "n": 3, "step": 7})["sandboxes"]
            assert [sb.id for sb in again] == [sb.id for sb in first] and len({sb.id for sb in first}) == 3
            assert grove.pool("swe")["claims"] == 2
            assert [sb.exec("echo ok").stdout for sb in first] == [b"ok\n"] * 3
            for sb in first:
                sb.close()
        finally:
            grove.delete_pool("swe")


def test_many_as_ready(user: RouterProcess) -> None:
    """The streamed batch examples: each rollout starts as its sandbox comes (2 claims, 1 fresh start), then
    as its part comes."""

    async def run(task: str, sandbox: AsyncSandbox) -> bytes:
        try:
            return (await sandbox.exec(f"echo {task}")).stdout
        finally:
            await sandbox.close()

    async def main() -> dict[str, Any]:
        async with AsyncGrove(user.url, user.key) as grove:
            await grove.create_pool("swe", size=2, resources={"cpu": 0.5, "memory_mb": 256})
            try:
                deadline = time.monotonic() + 60
                while (await grove.pool("swe"))["ready"] < 2:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
                namespace = await run_block_async(block(MARKERS["as_ready"]), {
                    "grove": grove, "tasks": ["a", "b", "c"], "step": 8, "run": run, "rollouts": [],
                    "failed": {}, "GroveError": GroveError, "asyncio": asyncio})
                namespace["outputs"] = sorted(await asyncio.gather(*namespace["rollouts"]))
                # The same burst a part at a time, once the pool has refilled.
                while (await grove.pool("swe"))["ready"] < 2:
                    assert time.monotonic() < deadline + 60
                    await asyncio.sleep(0.2)
                parts = await run_block_async(block(MARKERS["in_parts"]), {
                    **namespace, "tasks": ["d", "e", "f"], "step": 9, "rollouts": []})
                namespace["parts_outputs"] = sorted(await asyncio.gather(*parts["rollouts"]))
                namespace["claims"] = (await grove.pool("swe"))["claims"]
                return namespace
            finally:
                await grove.delete_pool("swe")

    before = user.live_ids()
    namespace = asyncio.run(main())
    assert namespace["failed"] == {} and namespace["outputs"] == [b"a\n", b"b\n", b"c\n"]
    assert namespace["parts_outputs"] == [b"d\n", b"e\n", b"f\n"]
    assert namespace["claims"] == 4
    assert user.live_ids() == before


def test_background_processes(user: RouterProcess, capsys: pytest.CaptureFixture[str]) -> None:
    with Grove() as grove, grove.create(heartbeat=False) as sb:
        namespace = run_block(block(MARKERS["processes"]), {"sb": sb})
        assert capsys.readouterr().out == "step 1\nstep 2\nstep 3\n"  # followed to its end
        job, server = sb.processes.get(namespace["job"].pid), sb.processes.get(namespace["server"].pid)
        assert (job.status, job.exit_code) == ("exited", 0)
        assert (server.status, server.exit_code, server.signalled) == ("exited", 143, "SIGTERM")


def test_ports(user: RouterProcess) -> None:
    with Grove() as grove, grove.create(heartbeat=False) as sb:
        sb.write_file("/workspace/index.html", "served from the sandbox\n")
        run_block(block(MARKERS["ports"]), {"sb": sb, "requests": requests, "url": user.url, "key": user.key})
        proxied = f"{user.url}/v1/sandboxes/{sb.id}/ports/8000/index.html"
        wait_for(lambda: requests.get(proxied, headers={"Authorization": f"Bearer {user.key}"}, timeout=10)
                 .status_code == 200, 30, what="the block's server, through the proxy")
        answer = requests.get(proxied, headers={"Authorization": f"Bearer {user.key}"}, timeout=10)
        assert answer.text == "served from the sandbox\n"
        assert requests.get(proxied, timeout=10).status_code == 401  # no key, no way in
        signed = sb.port_url(8000, expires_s=600)
        assert signed.startswith("http://") and f"{sb.id}-8000." in signed and "grove_token=" in signed


def test_checkpoints_and_forks(user: RouterProcess) -> None:
    with Grove() as grove, grove.create(heartbeat=False) as sandbox:
        sandbox.write_file("/workspace/notes.txt", "before the checkpoint\n")
        namespace = run_block(block(MARKERS["checkpoints"]), {"sandbox": sandbox, "grove": grove})
        made = [namespace["again"], *namespace["children"]]
        try:
            assert len(namespace["children"]) == 8 and namespace["cp"]["id"] in [
                c["id"] for c in sandbox.checkpoints()]
            for child in made:
                assert child.read_file("/workspace/notes.txt") == b"before the checkpoint\n"
            assert namespace["again"].status()["lineage"]["kind"] == "restore"
            assert {c.status()["lineage"]["parent"] for c in namespace["children"]} == {sandbox.id}
        finally:
            for child in made:
                child.close()
