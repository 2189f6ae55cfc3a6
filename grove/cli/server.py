"""``grove up``, ``grove down`` and ``grove key``: run the router on a state dir, stop it, manage its keys."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grove.cli import images
from grove.cli.common import client, state_dir
from grove.core.errors import Invalid, NotFound, Unavailable
from grove.runfile import RunningRouter, running_router
from grove.statedir import StateDir

STOP_WAIT_S = 60.0


def cmd_up(args: argparse.Namespace) -> int:
    """Start the router in the foreground."""
    from router.auth import load_or_create
    from router.server import listen_socket, serve
    from router.settings import RouterSettings

    state = state_dir(args)
    if (running := running_router(state)) is not None:
        raise Invalid(f"a router (pid {running.pid}) already serves {state} at {running.url}; "
                      f"stop it first (`grove --state-dir {state} down`) or pick another --state-dir")
    # Bound first: a busy port is said at once, and before a first start's key is made (and never shown).
    sock = listen_socket(args.host, args.port)
    StateDir(state).make_private()  # before the key file is written into it
    keys, new_key = load_or_create(state, os.environ.get("GROVE_API_KEY"))
    settings = RouterSettings(
        state_dir=state,
        api_keys=tuple(keys),
        host=args.host,
        port=args.port,
        backend=args.backend,
        s3=_s3_config(args),
        knative=_knative_options(args),
        artifact_retention_days=_days(args.artifact_retention_days, "GROVE_ARTIFACT_RETENTION_DAYS"),
        trajectory_retention_days=_days(args.trajectory_retention_days, "GROVE_TRAJECTORY_RETENTION_DAYS"),
        artifact_url_expires_s=args.artifact_url_expires,
        screenshot_mb=args.screenshot_mb,
        gc_interval_h=args.gc_interval_h,
        pull_missing=args.pull_missing,
        insecure_registries=tuple(args.insecure_registry or ()),
        image_limits=images.unpack_limits(args),
        max_sandboxes=args.max_sandboxes,
        memory_reserve_mb=args.memory_reserve_mb,
        disk_reserve_mb=args.disk_reserve_mb,
        ports_port=args.ports_port,
        ports_domain=args.ports_domain,
        shards=_shards(args),
    ).with_env(os.environ)
    asyncio.run(serve(settings, new_key=new_key, ready_file=args.ready_file, sock=sock))
    return 0


def _days(value: int | None, env: str) -> int | None:
    """A retention in days: the flag, else the environment variable, else None (the bucket's rules untouched)."""
    if value is not None:
        return value
    text = os.environ.get(env)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise Invalid(f"{env} must be a whole number of days, got {text!r}") from None


def _shards(args: argparse.Namespace) -> Any:
    """``--shard`` and ``--peers``, with the peers' shared secret from ``GROVE_PEER_SECRET``."""
    from router.shards.config import ShardConfig, parse_peers

    secret = os.environ.get("GROVE_PEER_SECRET")
    return ShardConfig(args.shard, parse_peers(args.peers or ""), secret.encode() if secret else None)


def _knative_options(args: argparse.Namespace) -> Any:
    """The Knative backend's options, when that is the backend."""
    if args.backend != "knative":
        return None
    from grove.cli.knative import options_from_args

    return options_from_args(args)


def _s3_config(args: argparse.Namespace) -> Any:
    """``--s3 URL`` with credentials from GROVE_S3_ACCESS_KEY/GROVE_S3_SECRET_KEY or ``--s3-credentials``."""
    if not args.s3:
        return None
    from artifacts.s3config import S3Config

    access, secret = os.environ.get("GROVE_S3_ACCESS_KEY"), os.environ.get("GROVE_S3_SECRET_KEY")
    if args.s3_credentials:
        data = json.loads(Path(args.s3_credentials).read_text())
        access, secret = data.get("access_key", access), data.get("secret_key", secret)
    if not access or not secret:
        raise Invalid(
            "--s3 needs credentials: set GROVE_S3_ACCESS_KEY and GROVE_S3_SECRET_KEY, or pass "
            '--s3-credentials FILE with {"access_key": ..., "secret_key": ...}'
        )
    return S3Config(endpoint=args.s3, access_key=access, secret_key=secret, bucket=args.s3_bucket)


def cmd_down(args: argparse.Namespace) -> int:
    """Delete every sandbox of a state dir (storing its trajectory) and every warm pool's unclaimed members, then
    stop its router and S3 server; the pools stay defined, at their sizes, for the next ``grove up``.

    With no router running, one is started on a free loopback port just for this (local backend), so
    sandboxes left by a stopped or killed router are still deleted and recorded, and an embedded S3
    server a killed router left behind is stopped with it.
    """
    from artifacts.s3proc import live_weed_pid

    state = state_dir(args)
    running = running_router(state)
    started = None
    if running is None:
        if not _has_records(state) and live_weed_pid(StateDir(state).s3) is None:
            print(f"grove down: nothing runs on {state}")
            return 0
        started, running = _start_router(state)
    args.url = running.url
    embedded_s3 = live_weed_pid(StateDir(state).s3) is not None
    deleted = 0
    # Every project's (the state dir's first key is its operator's, an admin: "*" lists across projects).
    with client(args, project="*") as grove:
        drained = _drain_pools(args, grove)
        for row in grove.list():
            grove.request("DELETE", f"/v1/sandboxes/{row['id']}")
            deleted += 1
    try:
        _stop(running)
    except Unavailable as exc:
        sizes = ", ".join(f"{p.name} {p.size}" for p in drained)
        raise Unavailable(f"{exc.message}; its warm pools were emptied first: `grove pool resize NAME SIZE` sets "
                          f"them back ({sizes})" if drained else exc.message) from exc
    if started is not None:
        started.wait(timeout=STOP_WAIT_S)
    _restore_sizes(state, drained)
    for pool in drained:
        if pool.members:
            print(f"grove down: stopped the {pool.members} unclaimed sandbox(es) of warm pool {pool.name} (the pool "
                  f"stays defined: the next `grove up` refills it to {pool.size}; `grove pool rm {pool.name}` "
                  "forgets it)")
    print(f"grove down: deleted {deleted} sandbox(es) (trajectories stored)")
    s3 = " and its embedded S3 server" if embedded_s3 else ""
    print(f"grove down: stopped the router (pid {running.pid}){s3}")
    return 0


@dataclass(frozen=True)
class Drained:
    """A warm pool ``grove down`` emptied (through the API, so that each member is deleted like any sandbox)."""

    name: str
    project: str
    size: int
    """Its size before: set back in its definition once the router is down, so that the next start refills it."""
    members: int
    """The unclaimed sandboxes it had, ready or starting."""


def _drain_pools(args: argparse.Namespace, grove: Any) -> list[Drained]:
    """Resize every pool of every project to 0, waiting until its members are gone (claimed sandboxes are listed,
    and go after)."""
    drained = []
    for pool in grove.pools():
        members = pool["ready"] + pool["starting"]
        if pool["size"] == 0 and members == 0:
            continue
        project = pool.get("project") or "default"
        with client(args, project=project) as owner:
            shown = owner.resize_pool(pool["name"], 0)
            deadline = time.monotonic() + STOP_WAIT_S
            while shown["ready"] + shown["starting"] and time.monotonic() < deadline:
                time.sleep(0.1)  # a member starting when the resize came is deleted once its start is done
                shown = owner.pool(pool["name"])
        drained.append(Drained(pool["name"], project, pool["size"], members))
    return drained


def _restore_sizes(state: Path, drained: list[Drained]) -> None:
    """Write each drained pool's size back into its definition (the router that emptied them is gone)."""
    from router.pools.files import PoolFiles
    from router.pools.filler import pool_key

    files = PoolFiles(state)
    for pool in drained:
        key = pool_key(pool.project, pool.name)
        try:
            files.save(key, replace(files.definition(key), size=pool.size))
        except NotFound:  # removed meanwhile (`grove pool rm` while down ran): nothing to set back
            continue


def _has_records(state: Path) -> bool:
    records = StateDir(state).records
    return records.is_dir() and any(records.iterdir())


def _start_router(state: Path) -> tuple[subprocess.Popen[bytes], RunningRouter]:
    """A router on ``state`` and a free loopback port, started to be stopped."""
    with tempfile.TemporaryDirectory(prefix="grove-down-") as tmp:
        ready = Path(tmp) / "ready"
        log = open(Path(tmp) / "log", "w+b")  # noqa: SIM115 - read back on failure
        proc = subprocess.Popen(
            [sys.executable, "-m", "grove", "--state-dir", str(state), "up", "--port", "0",
             "--ready-file", str(ready)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if ready.exists() and ready.read_text():
                log.close()
                return proc, RunningRouter(pid=proc.pid, url=ready.read_text())
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        log.seek(0)
        output = log.read().decode(errors="replace")[-2000:]
        log.close()
    raise Unavailable(f"could not start a router on {state} to stop its sandboxes:\n{output}")


def _stop(running: RunningRouter) -> None:
    """SIGTERM the router and wait until it is gone (it stops its embedded S3 server on the way)."""
    try:
        os.kill(running.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if not Path(f"/proc/{running.pid}").exists() or _zombie(running.pid):
            return
        time.sleep(0.05)
    raise Unavailable(f"the router (pid {running.pid}) did not stop within {STOP_WAIT_S:.0f}s")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def cmd_key(args: argparse.Namespace) -> int:
    """API keys in the state dir's key file; a running router picks changes up within a second."""
    from router import auth

    state = state_dir(args)
    StateDir(state).make_private()
    if args.key_cmd == "add":
        key = auth.add_key(state, " ".join(args.label), project=args.project_of_key, admin=args.admin)
        _define_project(state, args.project_of_key)
        role = "an admin" if args.admin else "a member"
        print(key)
        print(f"(shown once) {role} of project {args.project_of_key}; a running router takes it within a second",
              file=sys.stderr)
    elif args.key_cmd == "ls":
        rows = auth.list_keys(state)
        width = max([len("PROJECT"), *(len(project) for _, project, _, _ in rows)])
        print(f"{'KEY':<12}  {'PROJECT':<{width}}  {'ROLE':<6}  LABEL")
        for fp, project, role, label in rows:
            print(f"{fp:<12}  {project:<{width}}  {role:<6}  {label}".rstrip())
    else:
        print(f"revoked {auth.revoke_key(state, args.fingerprint)}")
    return 0


def _define_project(state: Path, name: str) -> None:
    """A key's project gets a definition (no quotas yet) if it has none, so `grove project ls` shows it."""
    from router.projects.files import ProjectFiles
    from router.projects.model import Project

    files = ProjectFiles(state)
    if name not in files.all():
        files.create(Project(name))


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``up``, ``down`` and ``key``."""
    from grove.cli.knative import add_cluster_options

    up = sub.add_parser("up", parents=[common], help="start the router")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8470)
    up.add_argument("--ports-port", type=int, default=0,
                    help="the listener serving sandboxes' ports as {id}-{port}.<domain> (default: any free port)")
    up.add_argument("--ports-domain", default="localhost",
                    help="the domain of those names (default localhost: *.localhost is loopback in browsers)")
    up.add_argument("--backend", default="local", choices=["local", "knative"])
    up.add_argument("--shard", default="default", metavar="NAME",
                    help="this router's shard, named in every sandbox id it makes (1-12 lower-case letters and "
                         "digits; default: default, whose ids keep the shape of before sharding)")
    up.add_argument("--peers", metavar="NAME=URL,...",
                    help="the other shards' routers: calls for their sandboxes are passed on to them, signed with "
                         "GROVE_PEER_SECRET (the same on every router)")
    up.add_argument("--s3", help="S3 endpoint URL (default: start an embedded S3 server on loopback)")
    up.add_argument("--s3-bucket", default="grove")
    up.add_argument("--s3-credentials", help='JSON file {"access_key": ..., "secret_key": ...}')
    up.add_argument("--artifact-retention-days", type=int, metavar="N",
                    help="S3 expires artifacts (pushed files, full outputs, their index) N days after they are "
                         "stored; 0: keep for ever (default $GROVE_ARTIFACT_RETENTION_DAYS, else the bucket's rules "
                         "are left alone)")
    up.add_argument("--trajectory-retention-days", type=int, metavar="N",
                    help="the same for trajectories, a rule of their own (default "
                         "$GROVE_TRAJECTORY_RETENTION_DAYS, else left alone: kept for ever)")
    up.add_argument("--artifact-url-expires", type=float, default=3600.0, metavar="SECONDS",
                    help="lifetime of the presigned GET URLs the router hands out (default 3600)")
    up.add_argument("--screenshot-mb", type=float, default=256.0, metavar="MIB",
                    help="most screenshot bytes one trajectory stores (distinct images and their thumbnails; "
                         "default 256); past it a computer step records the image's hash without storing it")
    up.add_argument("--gc-interval-h", type=float, default=6.0, metavar="HOURS",
                    help="hours between the router's own storage collections: what is past its project's "
                         "retention_days and owned by nothing live, and image layers nothing uses (default 6; "
                         "0: never; `grove storage gc` runs one now)")
    up.add_argument("--max-sandboxes", type=int, default=5000, metavar="N",
                    help="most live sandboxes at once, warm-pool members included (default 5000)")
    up.add_argument("--memory-reserve-mb", type=float, metavar="MIB",
                    help="local backend: memory the host keeps; creates wait (503 + Retry-After) while the host's "
                         "available memory, less what starting sandboxes take, is below it (default 5%% of the "
                         "host's, at least 1024; 0: no check)")
    up.add_argument("--disk-reserve-mb", type=float, metavar="MIB",
                    help="local backend: free space the state dir's file system keeps the same way (default 5%% "
                         "of it, at least 2048; 0: no check)")
    up.add_argument("--pull-missing", action="store_true",
                    help="local backend: a create naming a registry image not in the store pulls it first")
    up.add_argument("--insecure-registry", action="append", metavar="HOST:PORT",
                    help="a registry those pulls may reach over plain HTTP (repeatable; for loopback)")
    images.add_unpack_options(up)  # for the pulls of --pull-missing
    up.add_argument("--ready-file", help=argparse.SUPPRESS)
    add_cluster_options(up)
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", parents=[common],
                          help="delete every sandbox (storing its trajectory) and warm pool member, stop the router "
                               "and its S3 server (pool definitions stay)")
    down.set_defaults(func=cmd_down)

    key = sub.add_parser("key", parents=[common],
                         help="API keys: add, ls, revoke (a running router follows within a second)")
    ksub = key.add_subparsers(dest="key_cmd", required=True)
    kadd = ksub.add_parser("add", help="create a key and print it (the only time it is shown)")
    kadd.add_argument("label", nargs="*", help="a note kept next to the key (who has it)")
    kadd.add_argument("--project", dest="project_of_key", default="default", metavar="NAME",
                      help="the project the key belongs to: it sees and touches only that project's sandboxes, "
                           "pools, trajectories, artifacts and runs (default: default)")
    kadd.add_argument("--admin", action="store_true",
                      help="an operator's key: it may act in any project (X-Grove-Project, GROVE_PROJECT)")
    ksub.add_parser("ls", help="fingerprints and labels of the keys")
    krev = ksub.add_parser("revoke", help="remove a key by its fingerprint (or a unique prefix)")
    krev.add_argument("fingerprint")
    key.set_defaults(func=cmd_key)
