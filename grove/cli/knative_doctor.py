"""``grove knative doctor``: every requirement grove has of a cluster, checked against the live cluster.

Read-only (``get`` and ``list`` calls with the kubeconfig's credentials): each requirement of
:mod:`router.backends.knative.requirements` is printed as PASS, WARN or FAIL, a FAIL or WARN with the exact
change that fixes it. The exit status is 1 when anything fails (the router would refuse to start), else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from grove.core.errors import GroveError


def add_doctor_parser(ksub: Any, add_cluster_options: Any) -> None:
    """``grove knative doctor [cluster options]``."""
    doctor = ksub.add_parser("doctor", help="check a live cluster against everything grove needs (read-only)")
    add_cluster_options(doctor)
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print one line per requirement (and its fix); 1 if any fails."""
    from grove.cli.knative import options_from_args

    try:
        findings = asyncio.run(_findings(options_from_args(args)))
    except GroveError as exc:  # the API server itself: nothing else can be read
        print(f"FAIL  the Kubernetes API: {exc.message}", file=sys.stdout)
        return 1
    for finding in findings:
        print(f"{finding.state.upper():5} {finding.requirement}: {finding.found}")
        if finding.fix and finding.state != "pass":
            print(f"      fix: {finding.fix}")
    failed = sum(f.state == "fail" for f in findings)
    print(f"{len(findings)} requirements: {failed} failing, {sum(f.state == 'warn' for f in findings)} warnings")
    return 1 if failed else 0


async def _findings(options: Any) -> list[Any]:
    from router.backends.knative import requirements
    from router.backends.knative.kube import Kube, client_configuration

    kube = Kube(options, await asyncio.to_thread(client_configuration, options))
    try:
        installed = [await requirements.serving_installed(kube, ns) for ns in options.spread]
        return [*installed, *await requirements.survey(kube, options)]
    finally:
        kube.close()
