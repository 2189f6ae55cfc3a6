"""What the image tests share: a real registry on loopback per module, and the base layer images share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.imagetools import make_busybox_rootfs, tar_directory
from tests.support.registry import Registry, registry_server


@pytest.fixture(scope="module")
def registry() -> Iterator[Registry]:
    """A real registry (Debian's docker-registry) on a loopback port, for one test module."""
    with registry_server() as reg:
        yield reg


@pytest.fixture(scope="module")
def base_layer(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A busybox rootfs as one layer tar (about 2 MB): the base the tests' images share."""
    return tar_directory(make_busybox_rootfs(tmp_path_factory.mktemp("base") / "rootfs"))
