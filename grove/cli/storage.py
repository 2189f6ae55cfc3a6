"""``grove storage report|gc``: what each project keeps in object storage, and collecting what is past its
project's retention (``GET /v1/storage``, ``POST /v1/storage/gc``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from grove.cli.common import client

ALL = "*"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def cmd_storage(args: argparse.Namespace) -> int:
    """``report``: a table (or ``--json``); ``gc``: a pass (``--dry-run``: only what it would remove)."""
    with client(args, project=ALL if args.all else None) as grove:
        if args.storage_cmd == "report":
            body = grove.request("GET", "/v1/storage")
            print(json.dumps(body, indent=2) if args.json else _report_text(body))
            return 0
        body = grove.request("POST", "/v1/storage/gc", json_body={"dry_run": args.dry_run})
        print(json.dumps(body, indent=2) if args.json else _gc_text(body))
        return 1 if any(p.get("error") for p in body["projects"]) else 0


def _report_text(body: dict[str, Any]) -> str:
    kinds = list(body["projects"][0]["kinds"]) if body["projects"] else []
    head = f"{'PROJECT':<24} {'RETENTION':>10}" + "".join(f" {k.upper():>20}" for k in kinds)
    lines = [head + f" {'SPOOLED':>8} {'TOTAL':>11}"]
    for p in body["projects"]:
        days = "-" if p["retention_days"] is None else f"{p['retention_days']:g}d"
        cells = "".join(f" {_cell(p['kinds'][k]):>20}" for k in kinds)
        lines.append(f"{p['project']:<24} {days:>10}{cells} {p['spooled']:>8} {size(p['stored_bytes']):>11}")
    images = (body.get("host") or {}).get("images")
    if images:
        lines.append(f"\nimage layers on this host: {images['pieces']} ({size(images['bytes'])}); nothing uses "
                     f"{images['unused']} of them ({size(images['unused_bytes'])}): `grove storage gc --all` removes "
                     "those")
    return "\n".join(lines)


def _cell(total: dict[str, int]) -> str:
    return f"{total['count']} ({size(total['bytes'])})"


def _gc_text(body: dict[str, Any]) -> str:
    verb = "would remove" if body["dry_run"] else "removed"
    lines = []
    for p in body["projects"]:
        if p["retention_days"] is None:
            lines.append(f"{p['project']}: no retention_days, everything kept")
            continue
        done = [f"{kind} {t['count']} ({_owners(t['items'], kind)}, {size(t['bytes'])})"
                for kind, t in p["removed"].items() if t["items"]]
        lines.append(f"{p['project']}: {verb} {', '.join(done) if done else 'nothing'} (older than "
                     f"{p['retention_days']:g} days)")
        if p["kept_live"]["items"]:
            lines.append(f"  kept {p['kept_live']['items']} item(s) as old that live sandboxes still own "
                         f"({size(p['kept_live']['bytes'])})")
        if p["error"]:
            lines.append(f"  stopped: {p['error']} (the next pass tries again)")
    images = (body.get("host") or {}).get("images")
    if images is not None:
        lines.append(f"image layers and retired images nothing uses: {verb} {images['count']} "
                     f"({size(images['bytes'])})")
    lines.append(f"{'would free' if body['dry_run'] else 'freed'} {size(body['bytes_freed'])} in {body['took_s']}s")
    return "\n".join(lines)


def _owners(count: int, kind: str) -> str:
    noun = "run" if kind == "runs" else "sandbox"
    return f"{count} {noun}{'' if count == 1 else 'es' if noun == 'sandbox' else 's'}"


def size(count: int) -> str:
    """Bytes as ``12.3 MiB``."""
    value = float(count)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``storage``."""
    storage = sub.add_parser("storage", parents=[common],
                             help="what each project stores in S3, and collecting what is past its retention")
    ssub = storage.add_subparsers(dest="storage_cmd", required=True)
    report = ssub.add_parser("report", parents=[common],
                             help="per project: trajectories, pushed files, full outputs, run files, spooled records")
    gc = ssub.add_parser("gc", parents=[common],
                         help="remove what is older than its project's retention_days and owned by nothing live")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    for parser in (report, gc):
        parser.add_argument("--json", action="store_true", help="the router's answer as JSON")
        parser.add_argument("--all", action="store_true",
                            help="every project (an admin key), and with gc this host's unused image layers")
    storage.set_defaults(func=cmd_storage)
