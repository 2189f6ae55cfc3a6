"""The ``grove`` command: ``up``, ``ls``, ``create``, ``exec``, ``cp``, ``rm``, ``image import|ls|rm``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grove.errors import GroveError, Invalid
from router.knative.cli import add_cluster_options, add_knative_parser
from router.statedisk import storage_error

DEFAULT_STATE = Path.home() / ".local" / "share" / "grove"


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir or os.environ.get("GROVE_STATE_DIR") or DEFAULT_STATE).resolve()


def cmd_up(args: argparse.Namespace) -> int:
    """Start the router in the foreground."""
    from router.auth import load_or_create
    from router.server import serve
    from router.settings import RouterSettings

    state = _state_dir(args)
    keys, new_key = load_or_create(state, os.environ.get("GROVE_API_KEY"))
    settings = RouterSettings(
        state_dir=state,
        api_keys=tuple(keys),
        host=args.host,
        port=args.port,
        backend=args.backend,
        s3=_s3_config(args),
        knative=_knative_options(args),
    )
    asyncio.run(serve(settings, new_key=new_key, ready_file=args.ready_file))
    return 0


def _knative_options(args: argparse.Namespace) -> Any:
    """The Knative backend's options, when that is the backend."""
    if args.backend != "knative":
        return None
    from router.knative.cli import options_from_args

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


def _client(args: argparse.Namespace) -> Any:
    from router.auth import read_key
    from router.client import Grove

    key = os.environ.get("GROVE_API_KEY") or read_key(_state_dir(args))
    return Grove(args.url, key)


def cmd_ls(args: argparse.Namespace) -> int:
    """List live sandboxes."""
    labels = dict(item.split("=", 1) for item in args.label)
    with _client(args) as grove:
        rows = grove.list(labels)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ID':<20} {'STATUS':<8} {'IMAGE':<16} {'TASK':<20} CREATED")
    for row in rows:
        task = row["metadata"].get("task_id") or "-"
        print(f"{row['id']:<20} {row['status']:<8} {row['image']:<16} {task:<20} {row['created_at']:.0f}")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    """Create a sandbox and print its id."""
    options: dict[str, Any] = {"cpu": args.cpu, "memory_mb": args.memory_mb, "pids_max": args.pids_max,
                               "disk_mb": args.disk_mb}
    if args.ttl:
        options["ttl_s"] = args.ttl
    if args.idle_timeout:
        options["idle_timeout_s"] = args.idle_timeout
    if args.env:
        options["env"] = dict(item.split("=", 1) for item in args.env)
    meta = {k: v for k, v in (("task_id", args.task), ("model", args.model), ("harness", args.harness)) if v}
    if meta:
        options["metadata"] = meta
    with _client(args) as grove:
        sandbox = grove.create(args.image, heartbeat=False, **options)
    print(sandbox.id)
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a command in a sandbox; exits with the command's exit code."""
    command: str | list[str] = args.command if len(args.command) > 1 else args.command[0]
    with _client(args) as grove:
        result = grove.attach(args.id).exec(command, timeout_s=args.timeout, cwd=args.cwd, user=args.user)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    if result.timed_out:
        print(f"grove: timed out after {args.timeout}s", file=sys.stderr)
    return int(result.exit_code)


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy files: ``ID:/path LOCAL`` or ``LOCAL ID:/path`` (directories as archives)."""
    src, dst = args.src, args.dst
    with _client(args) as grove:
        if ":" in src and src.startswith("sb-"):
            sandbox_id, path = src.split(":", 1)
            sandbox = grove.attach(sandbox_id)
            entries = None
            try:
                entries = sandbox.list_files(path)
            except GroveError:
                entries = None
            if entries is not None:
                sandbox.download(path, dst)
            else:
                Path(dst).write_bytes(sandbox.read_file(path))
        elif ":" in dst and dst.startswith("sb-"):
            sandbox_id, path = dst.split(":", 1)
            sandbox = grove.attach(sandbox_id)
            if Path(src).is_dir():
                sandbox.upload(src, path)
            else:
                sandbox.write_file(path, Path(src).read_bytes(), mode=Path(src).stat().st_mode & 0o777)
        else:
            print("grove cp: one side must be SANDBOX_ID:/path", file=sys.stderr)
            return 2
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete sandboxes."""
    with _client(args) as grove:
        for sandbox_id in args.ids:
            grove.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
            print(f"deleted {sandbox_id}")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    """Import, list and remove local images (works on the state dir directly)."""
    from router.local.images import ImageStore

    store = ImageStore(_state_dir(args) / "images")
    if args.image_cmd == "import":
        image = store.import_image(args.name, Path(args.source), force=args.force)
        print(f"imported {image.name} {image.digest}")
        return 0
    if args.image_cmd == "rm":
        for name in args.names:
            store.remove(name)
            print(f"removed {name} (sandboxes made from it keep their copy until they are deleted)")
        return 0
    store.ensure_default()
    for image in store.list():
        print(f"{image.name:<24} {image.digest}  {image.source}")
    return 0


def cmd_trajectories(args: argparse.Namespace) -> int:
    """Stored trajectories: ``ls`` (filtered), ``get ID`` (JSON), ``export`` (chat-messages JSONL for SFT)."""
    from artifacts.export import write_jsonl

    params = {k: v for k, v in (("task_id", args.task), ("model", args.model), ("harness", args.harness)) if v}
    with _client(args) as grove:
        if args.traj_cmd == "get":
            print(json.dumps(_texty(grove.request("GET", f"/v1/trajectories/{args.id}")), indent=2))
            return 0
        items = grove.request("GET", "/v1/trajectories", params=params)["trajectories"]
        if args.traj_cmd == "ls":
            print(f"{'SANDBOX':<20} {'TASK':<24} {'MODEL':<16} {'HARNESS':<14} {'RESULT':<11} STEPS")
            for it in items:
                print(
                    f"{it['sandbox_id']:<20} {it.get('task_id') or '-'!s:<24} {it.get('model') or '-'!s:<16} "
                    f"{it.get('harness') or '-'!s:<14} {it.get('result') or '-'!s:<11} {it.get('steps', '-')}"
                )
            return 0
        records = (grove.request("GET", f"/v1/trajectories/{it['sandbox_id']}") for it in items)
        out = open(args.output, "w", encoding="utf-8") if args.output != "-" else sys.stdout  # noqa: SIM115
        try:
            count = write_jsonl(records, out)
        finally:
            if out is not sys.stdout:
                out.close()
    print(f"exported {count} trajectories to {args.output}", file=sys.stderr)
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    """API keys in the state dir's key file; a running router picks changes up within a second."""
    from router import auth

    state = _state_dir(args)
    if args.key_cmd == "add":
        print(auth.add_key(state, " ".join(args.label)))
    elif args.key_cmd == "ls":
        for fp, label in auth.list_keys(state):
            print(f"{fp}  {label}".rstrip())
    else:
        print(f"revoked {auth.revoke_key(state, args.fingerprint)}")
    return 0


def _texty(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _texty(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_texty(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(prog="grove", description="Sandboxes for AI-agent training and evaluation.")
    parser.add_argument("--state-dir", help=f"router state (default $GROVE_STATE_DIR or {DEFAULT_STATE})")
    parser.add_argument("--url", default=None, help="router URL (default $GROVE_URL or http://127.0.0.1:8470)")
    sub = parser.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="start the router")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8470)
    up.add_argument("--backend", default="local", choices=["local", "knative"])
    up.add_argument("--s3", help="S3 endpoint URL (default: start an embedded S3 server on loopback)")
    up.add_argument("--s3-bucket", default="grove")
    up.add_argument("--s3-credentials", help='JSON file {"access_key": ..., "secret_key": ...}')
    up.add_argument("--ready-file", help=argparse.SUPPRESS)
    up.set_defaults(func=cmd_up)

    ls = sub.add_parser("ls", help="list sandboxes")
    ls.add_argument("--label", action="append", default=[], help="filter k=v (repeatable)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)

    create = sub.add_parser("create", help="create a sandbox, print its id")
    create.add_argument("--image", default="default")
    create.add_argument("--cpu", type=float, default=1.0)
    create.add_argument("--memory-mb", type=int, default=1024)
    create.add_argument("--pids-max", type=int, default=512)
    create.add_argument("--disk-mb", type=int, default=10240, help="disk quota in MiB (writes past it: ENOSPC)")
    create.add_argument("--ttl", type=float)
    create.add_argument("--idle-timeout", type=float)
    create.add_argument("--env", action="append", default=[], help="K=V (repeatable)")
    create.add_argument("--task")
    create.add_argument("--model")
    create.add_argument("--harness")
    create.set_defaults(func=cmd_create)

    ex = sub.add_parser("exec", help="run a command: grove exec ID -- CMD...")
    ex.add_argument("id")
    ex.add_argument("--timeout", type=float, default=600.0)
    ex.add_argument("--cwd")
    ex.add_argument("--user", help="run as this user of the sandbox (name, uid, name:group, uid:gid; default root)")
    ex.add_argument("command", nargs="+")
    ex.set_defaults(func=cmd_exec)

    cp = sub.add_parser("cp", help="copy files in or out: ID:/path LOCAL | LOCAL ID:/path")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.set_defaults(func=cmd_cp)

    rm = sub.add_parser("rm", help="delete sandboxes")
    rm.add_argument("ids", nargs="+")
    rm.set_defaults(func=cmd_rm)

    image = sub.add_parser("image", help="local images")
    isub = image.add_subparsers(dest="image_cmd", required=True)
    imp = isub.add_parser("import", help="import a directory, rootfs tarball, docker save or OCI tarball")
    imp.add_argument("name")
    imp.add_argument("source")
    imp.add_argument("--force", action="store_true")
    isub.add_parser("ls", help="list images")
    irm = isub.add_parser("rm", help="remove images (sandboxes made from one keep their copy)")
    irm.add_argument("names", nargs="+")
    image.set_defaults(func=cmd_image)

    traj = sub.add_parser("trajectories", help="stored trajectories: ls, get, export")
    tsub = traj.add_subparsers(dest="traj_cmd", required=True)
    for name in ("ls", "export"):
        p = tsub.add_parser(name, help="list" if name == "ls" else "export chat-messages JSONL for SFT")
        p.add_argument("--task")
        p.add_argument("--model")
        p.add_argument("--harness")
        if name == "export":
            p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    tget = tsub.add_parser("get", help="one trajectory as JSON")
    tget.add_argument("id")
    traj.set_defaults(func=cmd_trajectories)

    key = sub.add_parser("key", help="API keys: add, ls, revoke (a running router follows within a second)")
    ksub = key.add_subparsers(dest="key_cmd", required=True)
    kadd = ksub.add_parser("add", help="create a key and print it (the only time it is shown)")
    kadd.add_argument("label", nargs="*", help="a note kept next to the key (who has it)")
    ksub.add_parser("ls", help="fingerprints and labels of the keys")
    krev = ksub.add_parser("revoke", help="remove a key by its fingerprint (or a unique prefix)")
    krev.add_argument("fingerprint")
    key.set_defaults(func=cmd_key)

    add_knative_parser(sub)
    add_cluster_options(up)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``grove`` command."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except GroveError as exc:
        print(f"grove: {exc.message}", file=sys.stderr)
        code = 1
    except OSError as exc:  # `grove up` or `grove image import` on a full state disk: say where to free space
        if (full := storage_error(exc, _state_dir(args))) is None:
            raise
        print(f"grove: {full.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
