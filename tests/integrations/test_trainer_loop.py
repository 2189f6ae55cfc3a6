"""A trainer's agent loop on grove, smoke-tested: SkyRL's mini-swe-agent path — mini-swe-agent's real
``DefaultAgent`` with its real ``LitellmModel`` talking to an OpenAI-compatible model server (a scripted one on
loopback, no model called) — in a grove sandbox through ``grove.integrations.minisweagent``; the grader a
SandboxFusion ``run_code`` of the agent's answer, as verl's code reward computes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.models.litellm_model import LitellmModel

from grove.integrations.minisweagent import GroveEnvironment
from tests.support.router_fixtures import RouterProcess
from tests.support.scripted_api import scripted_api

SOLUTION = "print(sum(int(x) for x in input().split()))"


@pytest.fixture
def grove_env_vars(router: RouterProcess, monkeypatch: pytest.MonkeyPatch) -> RouterProcess:
    """GROVE_URL and GROVE_API_KEY pointing at the module's router, as a trainer's job would export them."""
    monkeypatch.setenv("GROVE_URL", router.url)
    monkeypatch.setenv("GROVE_API_KEY", router.key)
    return router


def completion(thought: str, command: str, n: int) -> dict[str, Any]:
    """An OpenAI chat completion calling mini-swe-agent's ``bash`` tool."""
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": thought, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}


def test_mini_swe_agent_loop_with_an_openai_compatible_server_then_a_run_code_reward(
        grove_env_vars: RouterProcess) -> None:
    router = grove_env_vars
    script = [
        completion("Write the solution.", f"printf '%s\\n' '{SOLUTION}' > /workspace/sol.py && cat /workspace/sol.py",
                   1),
        completion("Check it.", "echo '2 40' | python3 /workspace/sol.py", 2),
        completion("Submit.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /workspace/sol.py", 3),
    ]
    with scripted_api(script) as api:
        model = LitellmModel(model_name="openai/scripted", cost_tracking="ignore_errors",
                             model_kwargs={"api_base": f"{api.url}/v1", "api_key": "not-used"})
        agent_config = {**get_config_from_spec("default.yaml")["agent"], "step_limit": 5}
        with GroveEnvironment(image="default", cwd="/workspace", timeout=30, memory_mb=256, task_id="a-plus-b",
                              model="scripted") as env:
            agent = DefaultAgent(model, env, **agent_config)
            info = agent.run("Read two integers from stdin and print their sum.")
            sandbox_id = env.sandbox.id
        sent = api.bodies("/v1/chat/completions")
    assert info["exit_status"] == "Submitted" and SOLUTION in info["submission"]
    assert len(sent) == 3 and sent[0]["tools"][0]["function"]["name"] == "bash"
    observations = [m for m in agent.messages if m["role"] == "tool"]
    assert "42" in observations[1]["content"]

    # The reward, as verl computes it: the submission run on hidden tests in a fresh sandbox.
    answer = requests.post(
        f"http://grove:{router.key}@127.0.0.1:{router.port}/sandbox-fusion/run_code", timeout=120,
        json={"code": SOLUTION, "language": "python", "stdin": "20 22", "run_timeout": 10, "compile_timeout": 10,
              "memory_limit_MB": 256, "files": {}, "fetch_files": []}).json()
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "42\n"
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{sandbox_id}")
    commands = [s["command"][-1] for s in record["steps"] if s["type"] == "exec"]
    assert commands[1] == "echo '2 40' | python3 /workspace/sol.py" and record["sandbox"]["model"] == "scripted"
