"""``grove project create|set|ls|show|rm``: projects and their quotas.

Definitions are files in the state dir (``<state>/projects/<name>.json``), written here as ``grove key`` writes
keys; a running router takes a change within a second. ``ls`` and ``show`` ask the router for what each
project holds now (with the state dir's admin key), or show the definitions alone when no router runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from grove.cli.common import client, state_dir
from grove.core.errors import GroveError, Invalid
from grove.statedir import StateDir

# flag -> (quota field, how the flag's value becomes the field's)
_QUOTA_FLAGS: dict[str, tuple[str, Any]] = {
    "sandboxes": ("sandboxes", int),
    "starting": ("starting", int),
    "cpu": ("cpu", float),
    "memory_mb": ("memory_mb", int),
    "disk_mb": ("disk_mb", int),
    "stored_gb": ("stored_bytes", lambda v: int(float(v) * (1 << 30))),
}


def _quota_value(flag: str, raw: str) -> Any:
    """A quota flag's value: a number, or ``none`` (no limit)."""
    if raw.lower() == "none":
        return None
    convert = _QUOTA_FLAGS[flag][1]
    try:
        value = convert(raw)
    except ValueError:
        raise Invalid(f"--{flag.replace('_', '-')} takes a number or 'none', got {raw!r}") from None
    if value < 0:
        raise Invalid(f"--{flag.replace('_', '-')} must not be negative, got {raw!r}")
    return value


def _changes(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The quotas the flags set (field -> value or None), and the retention (``...`` if not given)."""
    quotas = {_QUOTA_FLAGS[flag][0]: _quota_value(flag, getattr(args, flag))
              for flag in _QUOTA_FLAGS if getattr(args, flag) is not None}
    retention: Any = ...
    if args.retention_days is not None:
        retention = None if args.retention_days.lower() == "none" else float(args.retention_days)
        if retention is not None and retention <= 0:
            raise Invalid(f"--retention-days must be positive (or 'none'), got {args.retention_days!r}")
    return quotas, retention


def cmd_project(args: argparse.Namespace) -> int:
    """Define, change, list, show and remove projects."""
    from router.projects.files import ProjectFiles
    from router.projects.model import Project, check_name

    state = state_dir(args)
    files = ProjectFiles(state)
    if args.project_cmd in ("create", "set"):
        StateDir(state).make_private()
        check_name(args.name)
        quotas, retention = _changes(args)
        if args.project_cmd == "create":
            made = files.create(Project(args.name, dataclasses.replace(Project(args.name).quotas, **quotas),
                                        None if retention is ... else retention))
            print(f"created project {made.name}: {_quotas_text(made.to_dict())}\n"
                  f"give it keys with `grove key add NAME --project {made.name}`")
            return 0
        current = files.all().get(args.name) or Project(args.name)
        changed = Project(current.name, dataclasses.replace(current.quotas, **quotas),
                          current.retention_days if retention is ... else retention, current.created_at)
        files.save(changed)
        print(f"project {changed.name}: {_quotas_text(changed.to_dict())} (a running router applies it within a "
              "second; sandboxes already running are not stopped)")
        return 0
    if args.project_cmd == "rm":
        files.remove(args.name)
        print(f"removed project {args.name}'s definition (its keys and objects stay: `grove key revoke`, "
              "`grove storage gc`)")
        return 0
    projects = _from_router(args)
    if projects is None:  # no router runs on the state dir: the definitions alone
        projects = [{**p.to_dict(), "usage": None} for p in files.all().values()]
    if args.project_cmd == "show":
        found = [p for p in projects if p["name"] == args.name]
        if not found:
            raise Invalid(f"no project {args.name!r} (see `grove project ls`)")
        projects = found
    if args.json:
        print(json.dumps(projects, indent=1))
        return 0
    print(f"{'PROJECT':<20} {'SANDBOXES':>11} {'STARTING':>9} {'WAITING':>7} {'CPU':>11} {'MEMORY MiB':>17} "
          f"{'DISK MiB':>17} {'STORED GiB':>13}  RETENTION")
    for project in projects:
        print(_row(project))
    return 0


def _from_router(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Every project with its use, from the router on the state dir; None if no router answers there."""
    from grove.cli.common import router_url

    if router_url(args) is None and not getattr(args, "url", None):
        return None
    try:
        with client(args, project="*") as grove:
            projects: list[dict[str, Any]] = grove.request("GET", "/v1/projects")["projects"]
            return projects
    except GroveError:
        return None


def _used(usage: dict[str, Any] | None, key: str, quota: Any, scale: float = 1.0) -> str:
    have = "-" if usage is None or usage.get(key) is None else f"{usage[key] / scale:g}"
    return f"{have}/{'-' if quota is None else f'{quota / scale:g}'}"


def _waiting(usage: dict[str, Any] | None) -> str:
    """Its creates waiting for the host's room (no quota of its own; ``-`` from a router that does not say)."""
    return "-" if usage is None or usage.get("waiting") is None else str(usage["waiting"])


def _row(project: dict[str, Any]) -> str:
    q, u = project["quotas"], project.get("usage")
    retention = "kept" if project.get("retention_days") is None else f"{project['retention_days']:g} d"
    return (f"{project['name']:<20} {_used(u, 'sandboxes', q['sandboxes']):>11} "
            f"{_used(u, 'starting', q['starting']):>9} {_waiting(u):>7} {_used(u, 'cpu', q['cpu']):>11} "
            f"{_used(u, 'memory_mb', q['memory_mb']):>17} {_used(u, 'disk_mb', q['disk_mb']):>17} "
            f"{_used(u, 'stored_bytes', q['stored_bytes'], 1 << 30):>13}  {retention}")


def _quotas_text(project: dict[str, Any]) -> str:
    set_ = {k: v for k, v in project["quotas"].items() if v is not None}
    quotas = ", ".join(f"{k}={v:g}" for k, v in set_.items()) or "no quotas"
    retention = project.get("retention_days")
    return quotas + (f"; trajectories and artifacts kept {retention:g} days" if retention is not None else "")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``project``."""
    project = sub.add_parser("project", parents=[common], help="projects: their keys' quotas and retention")
    psub = project.add_subparsers(dest="project_cmd", required=True)
    for name, what in (("create", "define a project"), ("set", "change a project's quotas or retention")):
        p = psub.add_parser(name, parents=[common], help=what)
        p.add_argument("name")
        p.add_argument("--sandboxes", metavar="N|none", help="most live sandboxes (warm-pool members included)")
        p.add_argument("--starting", metavar="N|none", help="most sandboxes starting at once")
        p.add_argument("--cpu", metavar="CORES|none", help="most CPU reserved: the sum of its sandboxes' cpu")
        p.add_argument("--memory-mb", dest="memory_mb", metavar="MIB|none",
                       help="most memory reserved: the sum of its sandboxes' memory_mb")
        p.add_argument("--disk-mb", dest="disk_mb", metavar="MIB|none",
                       help="most disk reserved: the sum of its sandboxes' disk_mb")
        p.add_argument("--stored-gb", dest="stored_gb", metavar="GIB|none",
                       help="most bytes kept in object storage: trajectories, artifacts, run files")
        p.add_argument("--retention-days", dest="retention_days", metavar="DAYS|none",
                       help="stored trajectories, artifacts and run files older than this are collected")
        p.set_defaults(func=cmd_project)
    for name, what in (("ls", "every project: quotas against use"), ("show", "one project")):
        p = psub.add_parser(name, parents=[common], help=what)
        if name == "show":
            p.add_argument("name")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_project)
    rm = psub.add_parser("rm", parents=[common], help="remove a project's definition")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_project)
