"""Reading a task's docker-compose.yaml for grove (:mod:`grove.integrations.compose`): what is honoured comes out
as grove's service model, in dependency order; every key grove cannot map is refused naming it. The Harbor tests
(``test_harbor.py``) run such a file end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.integrations.compose import MAIN, Build, ComposeRefused, Healthcheck, Service, load


def _compose(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "docker-compose.yaml"
    path.write_text(text)
    return path


def test_honoured_keys_become_services_in_dependency_order(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "db.Dockerfile").write_text("FROM base\n")
    path = _compose(tmp_path, """
version: "3.8"
x-common: &common
  environment: [A=1, B=two=2]
services:
  main:
    depends_on:
      db: {condition: service_healthy}
      seed: {condition: service_completed_successfully}
  seed:
    image: tools:1
    command: sh -c 'echo "$$HOME" > /tmp/seeded'
    depends_on: [db]
  db:
    <<: *common
    build: {context: db, dockerfile: db.Dockerfile, args: {VERSION: 3}}
    entrypoint: ["/bin/db", "--port", 5432]
    working_dir: /var/db
    expose: ["5432"]
    healthcheck:
      test: ["CMD-SHELL", "pg_isready"]
      interval: 1m30s
      timeout: 500ms
      start_period: 2
""")
    compose = load(path)
    assert compose.order() == ["db", "seed", MAIN]
    assert compose.services["db"] == Service(
        "db", build=Build((tmp_path / "db").resolve(), (tmp_path / "db" / "db.Dockerfile").resolve(),
                          {"VERSION": "3"}),
        environment={"A": "1", "B": "two=2"}, entrypoint=["/bin/db", "--port", "5432"], working_dir="/var/db",
        healthcheck=Healthcheck(["/bin/sh", "-c", "pg_isready"], 90.0, 0.5, 3, 2.0, 5.0))
    # Compose splits a string command shell-like; `$$` is a literal `$`.
    assert compose.services["seed"].command == ["sh", "-c", 'echo "$HOME" > /tmp/seeded']
    assert compose.services["seed"].depends_on == {"db": "service_started"}
    assert compose.services[MAIN].depends_on == {"db": "service_healthy", "seed": "service_completed_successfully"}


@pytest.mark.parametrize(("body", "message"), [
    ("    volumes: [\"/etc:/etc\"]\n", "services.api.volumes: grove cannot map this key: it mounts host paths"),
    ("    privileged: true\n", "services.api.privileged: grove cannot map this key"),
    ("    network_mode: host\n", "services.api.network_mode: grove cannot map this key"),
    ("    ports: [\"8080:80\"]\n", "services.api.ports: grove cannot map this key: it publishes ports on the host"),
    ("    cap_add: [SYS_ADMIN]\n", "services.api.cap_add: grove cannot map this key"),
    ("    restart: always\n", "services.api.restart: not supported by grove's compose mapping"),
    ("    command: echo $HOME\n", "interpolates a variable from the host's environment"),
    ("    environment: [A=1, FROM_HOST]\n", "services.api.environment.FROM_HOST: has no value, so Compose would "
     "take it from the host's environment, which grove does not pass to a task; write the value"),
    ("    environment: {A: 1, FROM_HOST: }\n", "services.api.environment.FROM_HOST: has no value"),
    ("    build: {context: ., args: [VERSION]}\n", "services.api.build.args.VERSION: has no value"),
    ("    build: {context: ../..}\n", "services.api.build.context: '../..' leaves the task's environment"),
    ("    build: {context: ., target: dev}\n", "services.api.build.target: not supported by grove image build"),
    ("    depends_on: [nowhere]\n", "services.api.depends_on names 'nowhere', which is no service"),
    ("    depends_on: {main: {condition: service_ready}}\n", "services.api.depends_on.main.condition: must be one"),
    ("    healthcheck: {test: [CMD], interval: 1s}\n", "services.api.healthcheck.test: must be a string"),
    ("    healthcheck: {test: true, interval: soon}\n", "services.api.healthcheck.test: must be a string"),
    ("    healthcheck: {test: 'true', interval: soon}\n", "healthcheck.interval: 'soon' is not a duration"),
])
def test_keys_grove_cannot_map_are_refused_by_name(tmp_path: Path, body: str, message: str) -> None:
    path = _compose(tmp_path, "services:\n  api:\n    image: srv:1\n" + body)
    with pytest.raises(ComposeRefused) as refused:
        load(path)
    assert message in str(refused.value), str(refused.value)
    assert str(refused.value).startswith(f"{path}: ")


@pytest.mark.parametrize(("text", "message"), [
    ("services: {}\n", "needs a `services:` mapping with at least one service"),
    ("services:\n  api: {image: a}\nvolumes: {data: {}}\n", "top-level `volumes:` is not supported"),
    ("services:\n  Api_1: {image: a}\n", "services.Api_1: a grove service name is a host name"),
    ("services: [\n", "not a readable compose file"),
])
def test_a_file_grove_cannot_read_is_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ComposeRefused) as refused:
        load(_compose(tmp_path, text))
    assert message in str(refused.value), str(refused.value)


def test_a_dependency_cycle_is_refused_naming_it(tmp_path: Path) -> None:
    text = "services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n"
    compose = load(_compose(tmp_path, text))
    with pytest.raises(ComposeRefused, match="depends_on makes a cycle \\(a -> b -> a\\)"):
        compose.order()


def test_a_dockerfile_outside_the_context_but_inside_the_environment_is_kept(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    compose = load(_compose(tmp_path, "services:\n  api:\n    build: {context: app, dockerfile: ../Dockerfile}\n"))
    assert compose.services["api"].build == Build((tmp_path / "app").resolve(), (tmp_path / "Dockerfile").resolve(),
                                                  {})


def test_a_healthcheck_takes_only_the_keys_the_file_gives(tmp_path: Path) -> None:
    text = "services:\n  api:\n    image: srv:1\n    healthcheck: {test: 'true', retries: 5}\n"
    assert load(_compose(tmp_path, text)).services["api"].healthcheck == Healthcheck(["/bin/sh", "-c", "true"],
                                                                                    retries=5)
