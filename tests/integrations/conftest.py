"""Fixtures of the integrations' tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.router_fixtures import RouterProcess


@pytest.fixture
def e2b_env(router: RouterProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a user of E2B's SDK sets to use grove; every sandbox the test leaves is deleted."""
    monkeypatch.setenv("E2B_API_URL", f"{router.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{router.url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", router.key)
    monkeypatch.setenv("E2B_HTTP_VERSION", "1.1")
    before = router.live_ids()
    yield
    router.delete_all(keep=before)
