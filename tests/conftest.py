"""Shared pytest setup: generic helpers here, component fixtures in their own plugin modules."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from artifacts.s3proc import free_ports

# Component fixtures live in tests/support/; list each module here once.
# Plain helper modules whose asserts should fail as informatively as a test's own (pytest rewrites them).
pytest.register_assert_rewrite("tests.support.project_world", "tests.security.project_routes")

pytest_plugins = [
    "tests.support.executor_fixtures",
    "tests.support.s3_fixtures",  # before router_fixtures, which imports it (pytest rewrites its asserts first)
    "tests.support.router_fixtures",
    "tests.support.knative_fixtures",
]


def free_tcp_port() -> int:
    """A loopback port that was free a moment ago, for a child that binds it itself (a registry, a stand-in).

    Drawn at random from below the kernel's ephemeral range (:func:`artifacts.s3proc.free_ports`): a port the
    kernel picks for ``bind(0)`` or an outgoing connection comes from that range, and with tests in parallel
    one was taken between the pick and the child's bind. Below it, only another random pick can collide.
    """
    return free_ports(1)[0]


def loopback_listener() -> socket.socket:
    """A socket listening on a free loopback port, for a child to serve on (gunicorn's ``fd://``): unlike
    :func:`free_tcp_port`, no other process can take the port before the child serves."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def short_tempdir(prefix: str = "grove-t-") -> Iterator[str]:
    """A fresh directory under /tmp with a short path (Unix socket paths must stay under 108 bytes)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--run-slow``: also run the tests marked ``slow``."""
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (minutes each, and Debian's mirror; `make test-slow`)")


def pytest_configure(config: pytest.Config) -> None:
    """Register grove's markers."""
    config.addinivalue_line("markers", "local_only: about the local backend's host; not run against Knative")
    config.addinivalue_line("markers", "fast: pure logic, no router, sandbox or server (`make test-fast`)")
    config.addinivalue_line("markers", "embedded_s3: the module's ``router`` runs its own embedded S3 server")
    config.addinivalue_line("markers", "slow: a minute or more and the network (a real build from Debian's mirror); "
                                       "skipped unless --run-slow (`make test` and `make test-slow` give it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests about the host are not collected for the Knative parametrization of a module's router; slow tests
    are skipped unless asked for."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    run_slow = config.getoption("--run-slow")
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_knative = callspec is not None and callspec.params.get("any_router") == "knative"
        (dropped if on_knative and item.get_closest_marker("local_only") else keep).append(item)
        if not run_slow and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(reason="slow (minutes, and Debian's mirror): run with --run-slow, "
                                                    "or `make test-slow`"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
