"""The ``grove`` command: ``up``/``down``, sandboxes (``ls``, ``create``, ``exec``, ``cp``, ``rm``), background
processes (``proc``, ``ps``), ``image``, ``pool``, ``trajectories``, ``artifacts``, ``rollouts``, ``key``,
``project``, ``storage`` and ``knative``.

Each group of subcommands lives in its own module with a ``register(sub, common)`` function; server
modules are imported only by the commands that run them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from grove.cli import (
    artifacts,
    checkpoints,
    images,
    pools,
    processes,
    projects,
    rollouts,
    sandboxes,
    server,
    shell,
    storage,
    trajectories,
)
from grove.cli.common import DEFAULT_STATE, explain, state_dir
from grove.core.errors import GroveError

COMMANDS = (server, projects, sandboxes, processes, images, pools, trajectories, artifacts, rollouts, storage,
            checkpoints, shell)


def _common_options(default: object) -> argparse.ArgumentParser:
    """``--state-dir`` and ``--url``, accepted before the subcommand and after it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", default=default,
                        help=f"router state (default $GROVE_STATE_DIR or {DEFAULT_STATE})")
    common.add_argument("--url", default=default,
                        help="router URL, or several routers' comma-separated (one per shard) (default $GROVE_URL, "
                             "else the router running on the state dir, else http://127.0.0.1:8470)")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    from grove.cli.knative import add_knative_parser

    parser = argparse.ArgumentParser(prog="grove", description="Sandboxes for AI-agent training and evaluation.",
                                     parents=[_common_options(None)])
    sub = parser.add_subparsers(dest="cmd", required=True)
    # After the subcommand the options must not overwrite a value given before it with their default.
    common = _common_options(argparse.SUPPRESS)
    for module in COMMANDS:
        module.register(sub, common)
    add_knative_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``grove`` command."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except GroveError as exc:
        print(f"grove: {explain(args, exc).message}", file=sys.stderr)
        code = 1
    except BrokenPipeError:
        # `grove ... | head`: the reader is gone; end quietly, and keep Python's exit-time flush quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    except OSError as exc:  # `grove up` or `grove image import` on a full state disk: say where to free space
        from router.records.statedisk import storage_error

        if (full := storage_error(exc, state_dir(args))) is None:
            raise
        print(f"grove: {full.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
