"""What ``egress: allow`` opens on Knative: the internet, never the cluster or its metadata, unless listed.

The policies are validated against Kubernetes' own NetworkPolicy schema, and each ``except`` is checked
to lie strictly inside its ``cidr`` (the API server refuses anything else).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import kubernetes_validate
import pytest

from grove.core.errors import Invalid
from router.backends.base import Network
from router.backends.knative import egress, manifest
from router.backends.knative.options import KnativeOptions
from tests.knative.test_manifest import K8S_VERSION, spec

pytestmark = pytest.mark.fast


def policy(allow: tuple[str, ...] = (), cidrs: tuple[str, ...] = ()) -> dict[str, Any]:
    objects = manifest.build(spec(network=Network("allow", allow)), KnativeOptions(cluster_cidrs=cidrs),
                             image="python:3.11-slim")
    assert objects.policy is not None
    kubernetes_validate.validate(objects.policy, K8S_VERSION, strict=True)
    for rule in objects.policy["spec"]["egress"]:
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block:
                net = ipaddress.ip_network(block["cidr"])
                assert all(ipaddress.ip_network(e) != net and ipaddress.ip_network(e).subnet_of(net)  # type: ignore[arg-type]
                           for e in block.get("except", [])), block
    return objects.policy


def blocks(p: dict[str, Any]) -> dict[str, list[str]]:
    return {peer["ipBlock"]["cidr"]: peer["ipBlock"].get("except", [])
            for rule in p["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer}


def test_allow_without_entries_is_the_internet_not_the_cluster() -> None:
    got = blocks(policy(cidrs=("10.244.0.0/16", "10.96.0.0/12", "34.118.224.0/20", "fd12:3456::/48")))
    assert got["0.0.0.0/0"] == ["10.0.0.0/8", "34.118.224.0/20", "100.64.0.0/10", "169.254.0.0/16",
                                "172.16.0.0/12", "192.168.0.0/16"]  # the pod/service CIDRs inside 10/8 fold in
    assert got["::/0"] == ["fc00::/7", "fe80::/10"]  # fd00:ec2::254, the IPv6 metadata address, is in fc00::/7
    assert ipaddress.ip_address("fd00:ec2::254") in ipaddress.ip_network("fc00::/7")


def test_a_wide_entry_gets_the_same_exceptions_a_listed_private_range_opens_exactly() -> None:
    got = blocks(policy(("0.0.0.0/0:443", "10.1.2.0/24:5432", "100.64.0.0/10", "2001:db8::/32"),
                        cidrs=("203.0.113.0/24",)))
    assert "203.0.113.0/24" in got["0.0.0.0/0"] and "192.168.0.0/16" in got["0.0.0.0/0"]
    assert got["10.1.2.0/24"] == [] and got["100.64.0.0/10"] == []  # listed on purpose
    assert got["2001:db8::/32"] == []


@pytest.mark.parametrize("entry", ["169.254.169.254", "169.254.0.0/16:80", "fe80::1"])
def test_no_entry_opens_link_local_metadata(entry: str) -> None:
    with pytest.raises(Invalid, match="link-local"):
        egress.check((entry,))
    with pytest.raises(Invalid, match="link-local"):
        policy((entry,))


def test_cluster_cidrs_are_checked() -> None:
    with pytest.raises(Invalid, match="cluster CIDR"):
        KnativeOptions(cluster_cidrs=("10.0.0.1/8",))
