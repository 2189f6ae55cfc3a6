"""The Knative parts of the ``grove`` command: cluster options for ``grove up`` and ``grove knative manifest``.

``grove knative manifest`` needs no cluster: it validates the create options exactly as the API does
(the same request model), builds the spec the router would, and prints the objects the backend would
create for it, so they can be reviewed or checked in CI.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import Any

import yaml

from router.backends.knative import manifest
from router.backends.knative.options import DEFAULT_RUNTIME_CLASS, DEFAULT_RUNTIME_IMAGE, ENDPOINT_MODES, KnativeOptions


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """Options that say which cluster and namespace, and how every sandbox's objects look."""
    group = parser.add_argument_group("knative backend")
    group.add_argument("--namespace", default="grove-sandboxes", help="namespace of the sandboxes' objects")
    group.add_argument("--namespaces", type=_names, default=(),
                       help="namespaces to spread sandboxes over, comma-separated (instead of --namespace)")
    group.add_argument("--namespace-capacity", type=int, default=KnativeOptions.namespace_capacity,
                       help="sandboxes one namespace takes (default: within Kubernetes' 5,000 Services per namespace)")
    group.add_argument("--cluster-capacity", type=int, default=KnativeOptions.cluster_capacity,
                       help="sandboxes the cluster takes (default: within Kubernetes' 10,000 Services per cluster)")
    group.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    group.add_argument("--context", help="kubeconfig context (default: its current one)")
    group.add_argument("--runtime-image", default=DEFAULT_RUNTIME_IMAGE, help="image of the runtime init container")
    group.add_argument("--default-image", default=KnativeOptions.default_image,
                       help="image of sandboxes that ask for 'default'")
    group.add_argument("--instance", default="grove", help="this router's name in the grove.dev/instance label")
    group.add_argument("--endpoint-mode", default="revision", choices=ENDPOINT_MODES,
                       help="where data-path calls go: the revision's Service, the Service address, or the pod")
    group.add_argument("--cluster-domain", default=KnativeOptions.cluster_domain,
                       help="the cluster's DNS domain, in revision URLs (Knative's activator matches it in the Host)")
    group.add_argument("--request-timeout", type=int, default=3600, help="timeoutSeconds of every revision")
    group.add_argument("--api-qps", type=float, default=20.0, help="Kubernetes create/delete calls per second")
    group.add_argument("--api-burst", type=int, default=40, help="Kubernetes calls allowed at once")
    group.add_argument("--router-url", default=KnativeOptions.router_url,
                       help="the router as sandbox pods reach it (executors ask it for snapshot uploads)")
    group.add_argument("--snapshot-part-mib", type=int, default=KnativeOptions.snapshot_part_bytes // 2**20,
                       help="part size of snapshot uploads in MiB (at least 5, S3's smallest): the executor's "
                            "memory bound while it snapshots")
    group.add_argument("--cluster-cidr", action="append", default=[],
                       help="a pod, service or node CIDR of the cluster (repeatable): closed to egress: allow")
    group.add_argument("--runtime-class", default=DEFAULT_RUNTIME_CLASS,
                       help="RuntimeClass of every sandbox pod (default: gvisor; e.g. kata): a kernel of their own "
                       "for untrusted code. 'none': the node's runtime, sandboxes share the node's kernel")


def _names(value: str) -> tuple[str, ...]:
    """``a,b,c`` as a tuple of names."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


def options_from_args(args: argparse.Namespace) -> KnativeOptions:
    """The backend options from parsed :func:`add_cluster_options` arguments."""
    return KnativeOptions(
        namespace=args.namespace,
        namespaces=args.namespaces,
        namespace_capacity=args.namespace_capacity,
        cluster_capacity=args.cluster_capacity,
        kubeconfig=args.kubeconfig,
        context=args.context,
        runtime_image=args.runtime_image,
        default_image=args.default_image,
        instance=args.instance,
        endpoint_mode=args.endpoint_mode,
        cluster_domain=args.cluster_domain,
        request_timeout_s=args.request_timeout,
        create_qps=args.api_qps,
        create_burst=args.api_burst,
        delete_qps=args.api_qps,
        delete_burst=args.api_burst,
        runtime_class=None if args.runtime_class == "none" else args.runtime_class,
        cluster_cidrs=tuple(args.cluster_cidr),
        router_url=args.router_url,
        snapshot_part_bytes=args.snapshot_part_mib * 2**20,
    )


def add_knative_parser(sub: Any) -> None:
    """``grove knative manifest [create options]`` and ``grove knative doctor [cluster options]``."""
    knative = sub.add_parser("knative", help="Knative backend tools: manifest (no cluster needed), doctor")
    ksub = knative.add_subparsers(dest="knative_cmd", required=True)
    show = ksub.add_parser("manifest", help="print the objects a create would make, as YAML or JSON")
    show.add_argument("--image", default="default")
    show.add_argument("--cpu", type=float, default=1.0)
    show.add_argument("--memory-mb", type=int, default=1024)
    show.add_argument("--pids-max", type=int, default=512)
    show.add_argument("--disk-mb", type=int, default=10240)
    show.add_argument("--env", action="append", default=[], help="K=V (repeatable)")
    show.add_argument("--workdir", default="/workspace")
    show.add_argument("--egress", choices=("deny", "allow"), default="deny")
    show.add_argument("--allow", action="append", default=[], help="with --egress allow: CIDR[:port] (repeatable)")
    show.add_argument("--ttl", type=float)
    show.add_argument("--idle-timeout", type=float)
    show.add_argument("--task")
    show.add_argument("--model")
    show.add_argument("--harness")
    show.add_argument("--harness-version")
    show.add_argument("--id", help="sandbox id (default: a fresh one, as a create would pick)")
    show.add_argument("--format", choices=("yaml", "json"), default="yaml")
    add_cluster_options(show)
    show.set_defaults(func=cmd_manifest)
    from grove.cli.knative_doctor import add_doctor_parser

    add_doctor_parser(ksub, add_cluster_options)


def cmd_manifest(args: argparse.Namespace) -> int:
    """Print the Secret, Service and (with egress allow) NetworkPolicy of one sandbox."""
    from grove.core.schema import parse
    from router.models import CreateRequest
    from router.records.registry import SandboxRecord, new_id

    body: dict[str, Any] = {
        "image": args.image, "cpu": args.cpu, "memory_mb": args.memory_mb, "pids_max": args.pids_max,
        "disk_mb": args.disk_mb,
        "env": dict(item.split("=", 1) for item in args.env), "workdir": args.workdir,
        "network": {"egress": args.egress, "allow": args.allow},
    }
    if args.ttl:
        body["ttl_s"] = args.ttl
    if args.idle_timeout:
        body["idle_timeout_s"] = args.idle_timeout
    meta = {"task_id": args.task, "model": args.model, "harness": args.harness, "harness_version": args.harness_version}
    body["metadata"] = {k: v for k, v in meta.items() if v}
    request = parse(CreateRequest, body)
    record = SandboxRecord(id=args.id or new_id(), request=request, token=secrets.token_urlsafe(32),
                           created_at=time.time())
    options = options_from_args(args)
    spec = record.spec()
    objects = manifest.build(spec, options, image=options.image_for(spec.image)).all()
    if args.format == "json":
        json.dump(objects, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
    return 0
