"""Harbor's own CLI (``harbor run``, Python 3.12, from ``.venv-harbor``) with its ``oracle`` and ``nop`` agents
against a real router through ``grove.integrations.harbor:GroveEnvironment``, on offline tasks in Harbor's task
format: a Dockerfile task built by ``grove image build`` (FROM a pulled base, WORKDIR, ENV, RUN, COPY) and a
prebuilt-image task (pulled on demand). The oracle's reward is 1, the do-nothing agent's 0; every trial is a grove
sandbox labelled with Harbor's job, trial and task; a compose task is refused; a trial killed outright leaves no
sandbox once its heartbeats stop; ``--ek pool=`` claims from a pool of the task's image (another image's is refused)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_tcp_port
from tests.support.imagetools import make_busybox_rootfs, tar_directory
from tests.support.registry import Registry, registry_server, write_oci_layout
from tests.support.router_fixtures import RouterProcess, router_state, wait_for

REPO = Path(__file__).resolve().parents[2]
HARBOR = REPO / ".venv-harbor" / "bin" / "harbor"
PROVIDER = "grove.integrations.harbor:GroveEnvironment"
TASK_TOML = """schema_version = "1.4"

[metadata]

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = {agent_timeout}

[environment]
build_timeout_sec = 300.0
{extra}"""
VERIFY = ('#!/bin/sh\nif [ "$(cat /app/answer.txt 2>/dev/null)" = "{want}" ]; then echo 1; else echo 0; fi '
          "> /logs/verifier/reward.txt\n")


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    """A real registry on loopback for the module's images."""
    with registry_server() as reg:
        yield reg


@pytest.fixture(scope="module")
def base(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image in the registry: the Dockerfile task's FROM and the prebuilt task's image."""
    tmp = tmp_path_factory.mktemp("base")
    layer = tar_directory(make_busybox_rootfs(tmp / "rootfs"))
    write_oci_layout(tmp / "oci", [[layer, {"app": None, "app/prebuilt.txt": b"7\n"}]])
    registry.push(tmp / "oci", "harborbase:1")
    return registry.ref("harborbase:1")


@pytest.fixture(scope="module")
def router(registry: Registry) -> Iterator[RouterProcess]:
    """The module's router, pulling a registry image a create names on demand (the prebuilt task's)."""
    assert HARBOR.exists(), f"{HARBOR} is missing: `make harbor-venv` builds it (Python 3.12 from pyenv)"
    with router_state(up_args=("--pull-missing", "--insecure-registry", registry.host)) as r:
        yield r


def _task(root: Path, *, dockerfile: str | None = None, image: str | None = None, solve: str, want: str,
          files: dict[str, str] | None = None, agent_timeout: float = 120.0) -> Path:
    for sub in ("environment", "solution", "tests"):
        (root / sub).mkdir(parents=True)
    extra = f'docker_image = "{image}"\n' if image else ""
    (root / "task.toml").write_text(TASK_TOML.format(agent_timeout=agent_timeout, extra=extra))
    (root / "instruction.md").write_text(f"Write {want!r} to /app/answer.txt.\n")
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (root / "environment" / rel).write_text(text)
    for path, text in ((root / "solution" / "solve.sh", solve), (root / "tests" / "test.sh", VERIFY.format(want=want))):
        path.write_text(text)
        path.chmod(0o755)
    return root


def _harbor_env(router: RouterProcess) -> dict[str, str]:
    return {**os.environ, "GROVE_URL": router.url, "GROVE_API_KEY": router.key, "PYTHONPATH": str(REPO)}


def _run(router: RouterProcess, task: Path, agent: str, jobs: Path, job: str, *ek: str) -> dict[str, object]:
    """``harbor run`` of one task; the trial's result (Harbor's own result.json)."""
    argv = [str(HARBOR), "run", "-p", str(task), "--agent", agent, "--env", PROVIDER, "-o", str(jobs),
            "--job-name", job, "--ek", "heartbeat_timeout_s=10", *(a for e in ek for a in ("--ek", e))]
    done = subprocess.run(argv, env=_harbor_env(router), capture_output=True, timeout=600, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    trials = [p for p in (jobs / job).iterdir() if p.is_dir()]
    assert len(trials) == 1, trials
    result = json.loads((trials[0] / "result.json").read_text())
    assert isinstance(result, dict)
    return result


def _reward(result: dict[str, object]) -> float:
    verifier = result.get("verifier_result")
    assert isinstance(verifier, dict), json.dumps(result)[:3000]
    return float(verifier["rewards"]["reward"])


def _trajectories(router: RouterProcess, task: str, count: int) -> list[dict[str, Any]] | None:
    """Each stored trajectory record of ``task`` (``GET /v1/trajectories/{id}``), once there are ``count``."""
    items = router.http("GET", f"/v1/trajectories?task_id={task}").json()["trajectories"]
    if len(items) != count:
        return None
    return [router.http("GET", f"/v1/trajectories/{item.get('sandbox_id') or item['id']}").json() for item in items]


def _labelled(router: RouterProcess, task: str, count: int) -> list[tuple[str, str, str, str, float]] | None:
    """(job, task, harness, outcome, reward) of each stored trajectory of ``task``, once there are ``count``."""
    records = _trajectories(router, task, count)
    if records is None:
        return None
    found = []
    for record in records:
        sandbox, outcome = record["sandbox"], record["outcome"]
        found.append((sandbox["labels"]["harbor.job"], sandbox["labels"]["harbor.task"], sandbox["harness"],
                      outcome["result"], outcome["reward"]))
    return sorted(found)


def test_dockerfile_task_oracle_1_nop_0(router: RouterProcess, base: str, tmp_path: Path) -> None:
    dockerfile = (f"FROM {base}\nWORKDIR /app\nENV GREETING=hello\nRUN echo seeded > /app/seed.txt\n"
                  "COPY data.txt /app/data.txt\n")
    solve = '#!/bin/sh\ntest -f /app/seed.txt && echo "$GREETING $(cat data.txt)" > /app/answer.txt\n'
    task = _task(tmp_path / "greet", dockerfile=dockerfile, solve=solve, want="hello 42", files={"data.txt": "42\n"})
    oracle = _run(router, task, "oracle", tmp_path / "jobs", "oracle-job")
    assert _reward(oracle) == 1.0
    nop = _run(router, task, "nop", tmp_path / "jobs", "nop-job")
    assert _reward(nop) == 0.0
    # Built once (the second job found the image by the environment's content hash), each trial a labelled record.
    built = [line for line in router.cli("image", "ls").stdout.decode().splitlines() if line.startswith("harbor-")]
    assert len(built) == 1, built
    labels = wait_for(lambda: _labelled(router, "greet", 2), timeout=60, what="both trials' stored trajectories")
    assert labels == [("nop-job", "greet", "harbor", "fail", 0.0), ("oracle-job", "greet", "harbor", "pass", 1.0)], \
        labels
    assert router.live_ids() == set()


def test_prebuilt_image_task(router: RouterProcess, base: str, tmp_path: Path) -> None:
    solve = "#!/bin/sh\necho \"prebuilt $(cat /app/prebuilt.txt)\" > /app/answer.txt\n"
    task = _task(tmp_path / "prebuilt", image=base, solve=solve, want="prebuilt 7")
    assert _reward(_run(router, task, "oracle", tmp_path / "jobs", "pre-oracle")) == 1.0
    assert _reward(_run(router, task, "nop", tmp_path / "jobs", "pre-nop")) == 0.0


COMPOSE = """services:
  main:
    command: ["sh", "-c", "echo main started > /tmp/main.txt && exec sleep 3600"]
    environment:
      API_URL: http://api:8080
    depends_on:
      api:
        condition: service_healthy
  api:
    build:
      context: ./api
    healthcheck:
      test: ["CMD", "busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/answer"]
      interval: 1s
      retries: 60
  note:
    image: {base}
    environment:
      NOTE: ok
    working_dir: /srv
    command: sh -c 'echo "$$NOTE" > note && exec busybox httpd -f -p 9000 -h .'
    expose: ["9000"]
    healthcheck:
      test: busybox wget -q -O /dev/null http://127.0.0.1:9000/note
      interval: 1s
      retries: 60
"""
API_DOCKERFILE = ('FROM {base}\nRUN mkdir /www && echo 42 > /www/answer\n'
                  'CMD ["busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]\n')
# The verifier queries both siblings by their service names (the answer must be what they serve now) and finds
# what main's compose command wrote.
COMPOSE_VERIFY = ('#!/bin/sh\nwant="$(busybox wget -q -O - http://api:8080/answer)-$(busybox wget -q -O - '
                  'http://note:9000/note)"\nif [ "$want" = "42-ok" ] && [ "$(cat /app/answer.txt 2>/dev/null)" = '
                  '"$want" ] && [ -f /tmp/main.txt ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n')


def _compose_task(root: Path, base: str, compose: str, solve: str) -> Path:
    """A compose task: ``main`` from its Dockerfile, an ``api`` sibling built from ``api/``, ``note`` from an image."""
    task = _task(root, dockerfile=f"FROM {base}\nWORKDIR /app\n", solve=solve, want="42-ok",
                 files={"docker-compose.yaml": compose.format(base=base)})
    (task / "environment" / "api").mkdir()
    (task / "environment" / "api" / "Dockerfile").write_text(API_DOCKERFILE.format(base=base))
    (task / "tests" / "test.sh").write_text(COMPOSE_VERIFY)
    return task


def test_compose_task_runs_its_services_as_siblings(router: RouterProcess, base: str, tmp_path: Path) -> None:
    solve = ('#!/bin/sh\necho "$(busybox wget -q -O - "$API_URL/answer")-$(busybox wget -q -O - '
             'http://note:9000/note)" > /app/answer.txt\n')
    task = _compose_task(tmp_path / "composed", base, COMPOSE, solve)
    # Harbor's per-service calls: a collect hook runs in the `note` sibling, and its file comes back as an artifact.
    toml = TASK_TOML.format(agent_timeout=120.0, extra="").replace(
        'schema_version = "1.4"\n', 'schema_version = "1.4"\nartifacts = [{ source = "/tmp/collected.txt", '
        'service = "note" }]\n')
    (task / "task.toml").write_text(toml + '\n[[verifier.collect]]\nservice = "note"\n'
                                           'command = "cat /srv/note > /tmp/collected.txt"\n')
    assert _reward(_run(router, task, "oracle", tmp_path / "jobs", "compose-oracle")) == 1.0
    collected = list((tmp_path / "jobs" / "compose-oracle").rglob("collected.txt"))
    assert [p.read_text() for p in collected] == ["ok\n"], collected
    assert _reward(_run(router, task, "nop", tmp_path / "jobs", "compose-nop")) == 0.0
    # Each trial's siblings were labelled as its services (grove's `role` and `service` beside the trial's own
    # labels), and deleted with it.
    records = wait_for(lambda: _trajectories(router, "composed", 6), timeout=60,
                       what="six stored trajectories (two trials of three services)")
    assert len(records) == 6
    sandboxes = [record["sandbox"] for record in records]
    members = sorted((s["labels"]["harbor.job"], s["labels"].get("role", ""), s["labels"].get("service", ""),
                      s["harness"]) for s in sandboxes)
    assert members == [(job, *member) for job in ("compose-nop", "compose-oracle")
                       for member in (("", "", "harbor"), ("service", "api", "grove-service"),
                                      ("service", "note", "grove-service"))], members
    trials = [s["labels"]["harbor.trial"] for s in sandboxes]
    assert len(set(trials)) == 2 and all(trials.count(t) == 3 for t in trials), trials
    assert router.live_ids() == set()


def test_compose_keys_grove_cannot_map_are_refused(router: RouterProcess, base: str, tmp_path: Path) -> None:
    # One key through Harbor's CLI; the other refusals are tests/integrations/test_compose_file.py's.
    task = _compose_task(tmp_path / "volumes", base, COMPOSE + "    volumes: [\"/etc:/host-etc\"]\n", "#!/bin/sh\n")
    argv = [str(HARBOR), "run", "-p", str(task), "--agent", "oracle", "--env", PROVIDER, "-o", str(tmp_path / "j"),
            "--job-name", "volumes"]
    # Harbor prints the refusal in a rich traceback: wide enough that no line of it wraps.
    done = subprocess.run(argv, env={**_harbor_env(router), "COLUMNS": "1000"}, capture_output=True, timeout=300,
                          check=False, stdin=subprocess.DEVNULL)
    found = done.stdout.decode() + done.stderr.decode()
    assert "services.note.volumes: grove cannot map this key" in found, found[-3000:]
    assert router.live_ids() == set()


def test_a_killed_trial_leaves_no_sandbox(router: RouterProcess, base: str, tmp_path: Path) -> None:
    task = _task(tmp_path / "slow", image=base, solve="#!/bin/sh\nsleep 600\n", want="never", agent_timeout=900)
    argv = [str(HARBOR), "run", "-p", str(task), "--agent", "oracle", "--env", PROVIDER, "-o", str(tmp_path / "j"),
            "--job-name", "killed", "--ek", "heartbeat_timeout_s=5"]
    proc = subprocess.Popen(argv, env=_harbor_env(router), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: bool(router.live_ids()), timeout=120, what="the trial's sandbox")
        assert router.live_ids()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: harbor and its children, nothing else
        proc.wait(30)
    deadline = time.monotonic() + 60
    while router.live_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert router.live_ids() == set()


def test_a_killed_compose_trial_leaves_no_sibling(router: RouterProcess, base: str, tmp_path: Path) -> None:
    task = _compose_task(tmp_path / "slowcompose", base, COMPOSE, "#!/bin/sh\nsleep 600\n")
    (task / "task.toml").write_text(TASK_TOML.format(agent_timeout=900, extra=""))
    argv = [str(HARBOR), "run", "-p", str(task), "--agent", "oracle", "--env", PROVIDER, "-o", str(tmp_path / "j"),
            "--job-name", "killed-compose", "--ek", "heartbeat_timeout_s=5"]
    proc = subprocess.Popen(argv, env=_harbor_env(router), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:  # the agent's sandbox and both siblings
        wait_for(lambda: len(router.live_ids()) == 3, timeout=240, what="the trial's three sandboxes")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: harbor and its children, nothing else
        proc.wait(30)
    wait_for(lambda: not router.live_ids(), timeout=60, what="every sandbox of the killed trial reaped")
    assert router.live_ids() == set()


def test_preflight_refuses_bad_options_and_a_silent_router(router: RouterProcess, base: str, tmp_path: Path) -> None:
    task = _task(tmp_path / "pf", image=base, solve="#!/bin/sh\n", want="x")
    for extra, message in ((("--ek", "colour=red"), "Unknown option 'colour'"),
                           (("--ek", f"url=http://127.0.0.1:{free_tcp_port()}"), "does not answer")):
        argv = [str(HARBOR), "run", "-p", str(task), "--agent", "nop", "--env", PROVIDER, "-o", str(tmp_path / "j"),
                "--job-name", "pf", *extra]
        done = subprocess.run(argv, env=_harbor_env(router), capture_output=True, timeout=300, check=False,
                              stdin=subprocess.DEVNULL)
        out = done.stdout.decode() + done.stderr.decode()
        assert done.returncode != 0 and message in out, out[-3000:]
    assert router.live_ids() == set()


def test_trials_claim_from_a_pool_of_the_task_image(router: RouterProcess, base: str, tmp_path: Path) -> None:
    solve = "#!/bin/sh\necho \"prebuilt $(cat /app/prebuilt.txt)\" > /app/answer.txt\n"
    task = _task(tmp_path / "pooled", image=base, solve=solve, want="prebuilt 7")
    # Egress allowed: Harbor's default network policy is `public`, and a claim's network must be its pool's.
    made = router.http("POST", "/v1/pools", json_body={"name": "harbor-pool", "image": base, "size": 1,
                                                       "network": {"egress": "allow"}})
    other = router.http("POST", "/v1/pools", json_body={"name": "other-pool", "image": "default", "size": 0})
    assert (made.status, other.status) == (201, 201), made.body + other.body
    try:
        wait_for(lambda: router.http("GET", "/v1/pools/harbor-pool").json()["ready"] == 1, timeout=120,
                 what="a ready member of the task image's pool")
        result = _run(router, task, "oracle", tmp_path / "jobs", "pooled", "pool=harbor-pool")
        assert _reward(result) == 1.0
        assert router.http("GET", "/v1/pools/harbor-pool").json()["claims"] == 1
        # A pool of another image: the trial fails saying which image the pool runs; nothing was claimed.
        refused = _run(router, task, "oracle", tmp_path / "jobs", "wrong-pool", "pool=other-pool")
        assert "that pool's sandboxes run image 'default'" in json.dumps(refused), json.dumps(refused)[:3000]
        assert router.http("GET", "/v1/pools/other-pool").json()["claims"] == 0
    finally:
        for name in ("harbor-pool", "other-pool"):
            router.http("DELETE", f"/v1/pools/{name}")
    assert router.live_ids() == set()
