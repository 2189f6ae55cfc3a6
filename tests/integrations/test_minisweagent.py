"""mini-swe-agent's real agent loop on grove: its DefaultAgent, its builtin config and its deterministic test
model, with ``GroveEnvironment`` running every command in a sandbox of a real router; then its CLI."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# mini-swe-agent reads these at import: no banner, no writes to the user's home.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "grove-tests-mini-swe-agent"))

import minisweagent
import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

from artifacts.export import to_chat
from grove.integrations.minisweagent import GroveEnvironment
from tests.support.router_fixtures import RouterProcess, wait_for

ENV_CLASS = "grove.integrations.minisweagent.GroveEnvironment"
BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('tests pass')\n"
PATCH = ("python3 - <<'EOF'\nimport pathlib\np = pathlib.Path('calc.py')\n"
         "p.write_text(p.read_text().replace('a - b', 'a + b'))\nEOF")


@pytest.fixture
def grove_env_vars(router: RouterProcess, monkeypatch: pytest.MonkeyPatch) -> RouterProcess:
    """GROVE_URL and GROVE_API_KEY pointing at the module's router, as a user would export them."""
    monkeypatch.setenv("GROVE_URL", router.url)
    monkeypatch.setenv("GROVE_API_KEY", router.key)
    return router


def test_agent_loop_with_the_scripted_model(grove_env_vars: RouterProcess, tmp_path: Path) -> None:
    router = grove_env_vars
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text(BUGGY)
    (project / "test_calc.py").write_text(TEST)
    outputs = [
        make_output("THOUGHT: look at the code.", [{"command": "ls && cat calc.py"}]),
        make_output("THOUGHT: run the tests.", [{"command": "python3 test_calc.py"}]),
        make_output("THOUGHT: a slow check.", [{"command": "sleep 30"}]),
        make_output("THOUGHT: fix it.", [{"command": PATCH}]),
        make_output("THOUGHT: again.", [{"command": "python3 test_calc.py"}]),
        make_output("THOUGHT: submit.", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat calc.py"}]),
    ]
    agent_config = {**get_config_from_spec("default.yaml")["agent"], "step_limit": 10}
    local_out = tmp_path / "out"
    with GroveEnvironment(image="default", cwd="/workspace/project", timeout=2, memory_mb=256, task_id="mini-calc",
                          model="deterministic", env={"PYTHONDONTWRITEBYTECODE": "1"}) as env:
        env.upload(project, "/workspace/project")
        agent = DefaultAgent(DeterministicModel(outputs=outputs), env, **agent_config)
        info = agent.run("Fix add() in calc.py so that test_calc.py passes.")
        env.download("/workspace/project", local_out)
        env.post_result("pass", reward=1.0)
        sandbox_id = env.sandbox.id
    assert info["exit_status"] == "Submitted" and "a + b" in info["submission"]
    observations = [m for m in agent.messages if m["role"] == "user"][1:]
    assert [m["extra"]["returncode"] for m in observations] == [0, 1, -1, 0, 0]
    assert "AssertionError: -1" in observations[1]["content"]
    assert "timed out after 2 seconds" in observations[2]["extra"]["exception_info"]
    assert (local_out / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")

    with router.client() as grove:
        assert sandbox_id not in router.live_ids()
        record = grove.request("GET", f"/v1/trajectories/{sandbox_id}")
    sandbox = record["sandbox"]
    assert (sandbox["task_id"], sandbox["model"], sandbox["harness"], sandbox["harness_version"]) == (
        "mini-calc", "deterministic", "mini-swe-agent", minisweagent.__version__)
    execs = [s for s in record["steps"] if s["type"] == "exec"]
    assert [s["command"][-1] for s in execs] == [o["extra"]["actions"][0]["command"] for o in outputs]
    assert [s["exit_code"] for s in execs][:2] == [0, 1] and execs[2]["timed_out"]
    assert {s["type"] for s in record["steps"]} >= {"archive_write", "archive_read", "exec", "event"}
    assert record["outcome"]["result"] == "pass" and record["outcome"]["reward"] == 1.0
    chat = to_chat(record)
    calls = [c["function"]["arguments"] for m in chat["messages"] for c in m.get("tool_calls", [])]
    assert '"python3 test_calc.py"' in calls[1]  # `bash -c CMD` exports as the tool call CMD
    assert chat["metadata"]["resolved"] is True and chat["metadata"]["infra_errors"] == []


def test_config_file_spec_lifecycle_and_abandoned_environments(grove_env_vars: RouterProcess) -> None:
    router = grove_env_vars
    env = get_environment({"environment_class": ENV_CLASS, "image": "default", "memory_mb": 128, "timeout": 5,
                           "env": {"GREETING": "hi"}, "labels": {"suite": "mini"}})
    assert isinstance(env, GroveEnvironment)
    assert env.execute({"command": "echo $GREETING from $(pwd)"}) == {
        "output": "hi from /workspace\n", "returncode": 0, "exception_info": ""}
    assert env.execute("exit 3")["returncode"] == 3  # mini-swe-agent 1.x passed the command itself
    template = env.get_template_vars()
    assert {"system", "release", "machine", "sandbox_id", "image"} <= set(template) and "api_key" not in template
    saved = env.serialize()["info"]
    assert saved["config"]["environment_type"] == ENV_CLASS and saved["grove"]["sandbox_id"] == env.sandbox.id
    assert env.sandbox.id in router.live_ids()
    env.cleanup()
    env.close()  # idempotent
    assert env.sandbox.id not in router.live_ids()

    dropped = GroveEnvironment(image="default", memory_mb=128)
    dropped_id = dropped.sandbox.id
    del dropped
    gc.collect()
    wait_for(lambda: dropped_id not in router.live_ids(), 10, what="the abandoned sandbox to be deleted")


def test_mini_cli_with_grove_environment_from_a_config_file(grove_env_vars: RouterProcess, tmp_path: Path) -> None:
    router = grove_env_vars
    config = tmp_path / "grove.yaml"
    config.write_text(f"""
agent: {{agent_class: default, step_limit: 5}}
model:
  model_class: deterministic
  model_name: deterministic
  outputs:
    - {{role: assistant, content: look, extra: {{actions: [{{command: "uname -s"}}]}}}}
    - {{role: assistant, content: done,
        extra: {{actions: [{{command: "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]}}}}
environment: {{environment_class: {ENV_CLASS}, image: default, memory_mb: 128, task_id: mini-cli}}
""")
    env = {**os.environ, "MSWEA_CONFIGURED": "1"}
    mini = str(Path(sys.executable).with_name("mini"))
    done = subprocess.run([mini, "-c", "mini.yaml", "-c", str(config), "--yolo", "--exit-immediately", "-t", "hello",
                           "-o", str(tmp_path / "run.traj.json")], env=env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with router.client() as grove:
        # mini never closes its environment: the finalizer deleted the sandbox when the process ended.
        stored = wait_for(lambda: grove.request("GET", "/v1/trajectories", params={"task_id": "mini-cli"})[
            "trajectories"], 10, what="the CLI run's trajectory")
    assert stored[0]["harness"] == "mini-swe-agent" and stored[0]["steps"] == 2


def test_metadata_is_taken_as_the_sdks_create_takes_it(grove_env_vars: RouterProcess) -> None:
    router = grove_env_vars
    metadata = {"task_id": "meta-task", "model": "meta-model", "labels": {"run": "r1"}}
    with GroveEnvironment(image="default", memory_mb=128, labels={"suite": "mini"}, metadata=metadata) as env:
        row = router.http("GET", f"/v1/sandboxes/{env.sandbox.id}").json()
        assert row["metadata"]["task_id"] == "meta-task" and row["metadata"]["model"] == "meta-model"
        assert row["metadata"]["harness"] == "mini-swe-agent"
        assert row["metadata"]["labels"] == {"suite": "mini", "run": "r1"}
