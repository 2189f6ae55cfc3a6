"""``grove pool create|ls|get|resize|rm``: warm pools of ready sandboxes, claimed by ``grove create --pool``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from grove.cli.common import client


def _row(pool: dict[str, Any]) -> str:
    res = pool["resources"]
    error = f"  error: {pool['error']}" if pool.get("error") else ""
    return (f"{pool['name']:<20} {pool['image']:<16} {pool['size']:>5} {pool['ready']:>6} {pool['starting']:>9} "
            f"{pool['claims']:>7}  cpu={res['cpu']:g} mem={res['memory_mb']}MiB{error}")


_HEADER = f"{'NAME':<20} {'IMAGE':<16} {'SIZE':>5} {'READY':>6} {'STARTING':>9} {'CLAIMS':>7}  RESOURCES"


def _made(pool: dict[str, Any]) -> str:
    """What ``pool create`` made, in words: name, size, the spec its sandboxes have, what happens next."""
    res, net = pool["resources"], pool["network"]
    egress = "no egress" if net["egress"] == "deny" else (
        f"egress to {', '.join(net['allow'])}" if net["allow"] else "egress anywhere")
    return (f"created pool {pool['name']}: {pool['size']} sandbox(es) of image {pool['image']} kept ready, each "
            f"cpu={res['cpu']:g} memory={res['memory_mb']}MiB pids={res['pids_max']} disk={res['disk_mb']}MiB, "
            f"{egress}, workdir {pool['workdir']}\n"
            f"filling in the background (`grove pool get {pool['name']}` shows how far); "
            f"`grove create --pool {pool['name']}` claims one")


def cmd_pool(args: argparse.Namespace) -> int:
    """Define, list, show, resize and delete warm pools."""
    with client(args) as grove:
        if args.pool_cmd == "create":
            resources = {k: v for k, v in (("cpu", args.cpu), ("memory_mb", args.memory_mb),
                                           ("pids_max", args.pids_max), ("disk_mb", args.disk_mb)) if v is not None}
            network: dict[str, Any] = {"egress": "allow", "allow": args.allow} if args.allow is not None else {}
            shown = grove.create_pool(args.name, args.image, size=args.size, resources=resources, network=network)
            print(json.dumps(shown, indent=2) if args.json else _made(shown))
            return 0
        elif args.pool_cmd == "ls":
            rows = grove.pools()
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print(_HEADER)
                for row in rows:
                    print(_row(row))
            return 0
        elif args.pool_cmd == "get":
            shown = grove.pool(args.name)
        elif args.pool_cmd == "resize":
            shown = grove.resize_pool(args.name, args.size)
        else:
            shown = grove.delete_pool(args.name)
            print(f"deleted pool {args.name} and its unclaimed sandboxes")
            return 0
    print(json.dumps(shown, indent=2) if getattr(args, "json", False) else f"{_HEADER}\n{_row(shown)}")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``pool``."""
    pool = sub.add_parser("pool", parents=[common], help="warm pools: sandboxes started ahead, claimed at once")
    psub = pool.add_subparsers(dest="pool_cmd", required=True)
    create = psub.add_parser("create", parents=[common], help="define a pool and start filling it")
    create.add_argument("name")
    create.add_argument("--image", default="default")
    create.add_argument("--size", type=int, default=1, help="ready sandboxes to keep (default 1)")
    create.add_argument("--cpu", type=float, help="CPU limit in cores (default 1)")
    create.add_argument("--memory-mb", type=int, help="memory limit in MiB (default 1024)")
    create.add_argument("--pids-max", type=int, help="most processes and threads (default 512)")
    create.add_argument("--disk-mb", type=int, help="disk quota in MiB (default 10240)")
    create.add_argument("--allow", action="append", metavar="CIDR[:PORT]",
                        help="egress allowed to this destination (repeatable; default: no egress)")
    create.add_argument("--json", action="store_true")
    ls = psub.add_parser("ls", parents=[common], help="list pools")
    ls.add_argument("--json", action="store_true")
    get = psub.add_parser("get", parents=[common], help="one pool's definition and counts")
    get.add_argument("name")
    get.add_argument("--json", action="store_true")
    resize = psub.add_parser("resize", parents=[common], help="change a pool's size")
    resize.add_argument("name")
    resize.add_argument("size", type=int)
    resize.add_argument("--json", action="store_true")
    rm = psub.add_parser("rm", parents=[common], help="delete a pool and its unclaimed sandboxes")
    rm.add_argument("name")
    pool.set_defaults(func=cmd_pool)
