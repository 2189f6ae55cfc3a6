"""The API's egress allow-list entries, parsed the same for every backend (``router/backends/egress.py``)."""

from __future__ import annotations

import ipaddress

import pytest

from grove.core.errors import Invalid
from router.backends.egress import Destination, parse_allow
from router.backends.local.egress_rules import parse_allow as local_allow

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`


@pytest.mark.parametrize(("entry", "network", "port"), [
    ("198.51.100.7", "198.51.100.7/32", None),
    ("198.51.100.0/24", "198.51.100.0/24", None),
    ("198.51.100.0/24:443", "198.51.100.0/24", 443),
    ("198.51.100.7:53", "198.51.100.7/32", 53),
    ("0.0.0.0/0", "0.0.0.0/0", None),
    ("2001:db8::1", "2001:db8::1/128", None),
    ("2001:db8::/32", "2001:db8::/32", None),
    ("2001:db8::/32:443", "2001:db8::/32", 443),
    ("[2001:db8::1]:80", "2001:db8::1/128", 80),
    ("[2001:db8::/48]:8443", "2001:db8::/48", 8443),
])
def test_entries(entry: str, network: str, port: int | None) -> None:
    assert parse_allow([entry]) == [Destination(ipaddress.ip_network(network), port)]


@pytest.mark.parametrize(("entry", "needle"), [
    ("10.0.0.1/8", "has host bits set"),
    ("10.0.0.0/33", "not an address or network"),
    ("1.2.3.4:0", "bad port '0'"),
    ("1.2.3.4:65536", "bad port '65536'"),
    ("1.2.3.4:", "bad port ''"),
    ("1.2.3.4:8²", "bad port"),
    ("1.2.3.4/24:80", "has host bits set"),
    ("01.2.3.4", "not an address or network"),
    (" 1.2.3.4", "not an address or network"),
    ("example.com", "not an address or network"),
    ("[2001:db8::1]80", "[ADDRESS]:PORT"),
    ("", "not an address or network"),
])
def test_bad_entries_are_named(entry: str, needle: str) -> None:
    with pytest.raises(Invalid) as caught:
        parse_allow(["198.51.100.0/24", entry])
    assert repr(entry) in caught.value.message and needle in caught.value.message, caught.value.message


def test_the_local_backend_takes_ipv4_only_and_empty_means_everything() -> None:
    assert local_allow([]) == [Destination(ipaddress.IPv4Network("0.0.0.0/0"), None)]
    assert local_allow(["198.51.100.0/24:443"]) == parse_allow(["198.51.100.0/24:443"])
    for entry in ("2001:db8::/32", "[::1]:80"):
        with pytest.raises(Invalid, match="IPv6 is not supported on the local backend"):
            local_allow([entry])
