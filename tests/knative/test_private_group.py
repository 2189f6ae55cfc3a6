"""A private group (``network.group``) on the Knative backend: refused before anything is made, saying what to do."""

from __future__ import annotations

import pytest

from grove.core.errors import Invalid
from router.backends.base import Network
from router.backends.knative.backend import KnativeBackend
from tests.knative.test_backend import calls, run, spec
from tests.support.knative_fixtures import Cluster


def test_a_private_group_is_refused_before_anything_is_made(cluster: Cluster) -> None:
    grouped = spec(network=Network(group="office-1"), group="default/office-1")

    async def body(backend: KnativeBackend) -> None:
        with pytest.raises(Invalid) as err:
            backend.check(grouped)
        assert err.value.status == 422
        assert "network.group (a private network between sandboxes) is not supported on the knative backend" \
            in err.value.message
        assert "create the sandbox without 'group', or use a local router" in err.value.message
        backend.check(spec())  # the same sandbox without a group passes

    run(cluster, body)
    assert calls(cluster, grouped.id) == {}
