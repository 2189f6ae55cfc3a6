"""The layers stay visible: who may import whom, checked on the source (kopf-style import layers).

- ``executor`` and ``sandbox_image`` never import ``router`` (the daemon knows nothing of routers);
- ``artifacts`` imports neither ``executor`` nor ``router``, and its snapshot side runs without ``minio``;
- ``router`` (the server) never imports grove's front ends (``grove.cli``, ``grove.demo``, ``grove.integrations``,
  ``grove.client``): the server owns no SDK code;
- importing the user-side package (``grove``, its SDK and CLI) loads no server module;
- ``router`` has no import cycle among its modules, function-level imports included;
- ``router``'s folders are layers, each importing only those below it (:data:`ROUTER_LAYERS`), function-level
  imports included: no back-arrow, so no cycle between folders either;
- the kernel ``grove.core`` imports nothing of grove outside itself, and ``grove.client`` (the SDK) loads no
  module of ``router``, ``artifacts`` or ``executor``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`

REPO = Path(__file__).resolve().parent.parent
FRONT_ENDS = ("grove.cli", "grove.demo", "grove.integrations", "grove.client")


def sources(package: str) -> Iterator[Path]:
    """Every Python file of a top-level package."""
    yield from sorted((REPO / package).rglob("*.py"))


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Full dotted names of every module a file imports (function-level imports too, unless asked not to)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def tops(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("package", ["executor", "sandbox_image"])
def test_the_sandbox_side_never_imports_the_router(package: str) -> None:
    for path in sources(package):
        assert "router" not in tops(imports(path)), path


def test_artifacts_imports_neither_executor_nor_router() -> None:
    for path in sources("artifacts"):
        assert not tops(imports(path)) & {"executor", "router"}, path


def test_the_server_owns_no_front_end_code() -> None:
    for path in sources("router"):
        used = {name for name in imports(path) if name.startswith(FRONT_ENDS)}
        assert not used, f"{path} imports {used}"


def test_importing_the_user_side_loads_no_server_module() -> None:
    code = (
        "import sys\n"
        "import grove, grove.client, grove.cli, grove.core.errors, grove.core.wire\n"
        "from grove import Grove, AsyncGrove, Sandbox, NotFound\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('router', 'executor', 'flask', 'gunicorn'))\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "", f"server modules loaded by importing grove: {done.stdout}"


def test_router_has_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in sources("router"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        graph[module] = {name for name in imports(path) if name.startswith("router")}
    modules = set(graph)
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for dep in graph[module]:
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(dep):], dep]))
            if dep not in state:
                visit(dep, [*trail, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_snapshot_modules_load_without_minio() -> None:
    # What the executor uses inside a sandbox, whose runtime bundle has no minio (nor urllib3).
    code = (
        "import sys; sys.modules['minio'] = None; sys.modules['urllib3'] = None\n"
        "import artifacts.snapshot, artifacts.presigned, artifacts.unpack, artifacts.multipart\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


ROUTER_LAYERS: list[set[str]] = [
    {"server"},
    {"app"},                                  # assembly: the backend, routes, middleware, viewer, lifetime
    {"ui"},                                   # the viewer (uses the API's helpers)
    {"api"},                                  # handlers, route table, middleware, replies
    {"lifecycle"},                            # the service, starts, claims, scaling, reaper, keep-warm
    {"checkpoints"},                          # checkpoints, restores and forks, their index
    {"housekeeping"},                         # what projects store: report, collection past retention, bytes
    {"pools"},                                # warm pools and their filler
    {"ports"},                                # tunnels to a sandbox's ports, signed port URLs, traffic counts
    {"trajectory"},                           # recorder, journals, full outputs, pushes, the archive
    {"records"},                              # the registry, its files and log, the state disk
    {"upstream"},                             # the executor's client
    {"storage"},                              # object storage, embedded or not
    {"settings"},                             # the router's configuration
    {"backends.local", "backends.knative"},   # each backend with its parts (never each other)
    {"backends"},                             # the protocol every backend implements, egress entries
    {"auth", "shards"},                       # API keys and the caller each stands for; shards, peers, signing
    {"projects", "models", "logs", "connections", "answer"},  # leaves: projects, request models, the log,
    # connection limits, an answer whose caller may hang up
]
"""``router``'s folders (and top-level modules) from the top down: each may import only what is below it."""


def _router_unit(module: str) -> str | None:
    """The layer unit of a ``router`` module: its folder (``backends.local`` and ``backends.knative`` apart)."""
    parts = module.split(".")
    if parts[0] != "router" or len(parts) < 2:
        return None
    if parts[1] == "backends" and len(parts) > 2 and parts[2] in ("local", "knative"):
        return f"backends.{parts[2]}"
    return parts[1]


def test_router_layers_point_down() -> None:
    rank = {unit: i for i, layer in enumerate(ROUTER_LAYERS) for unit in layer}
    back: list[str] = []
    for path in sources("router"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        here = _router_unit(module)
        if here is None:  # router/__init__.py: the package itself imports nothing of its own
            assert not {n for n in imports(path) if n.startswith("router")}, path
            continue
        assert here in rank, f"{module} is in no layer of ROUTER_LAYERS: add its folder there"
        for name in imports(path):
            there = _router_unit(name)
            if there is None or there == here or there not in rank:
                continue
            if rank[there] <= rank[here]:  # up, or sideways within a layer (local and knative)
                back.append(f"{module} imports {name} ({here} -> {there})")
    assert not back, "imports against the layers:\n  " + "\n  ".join(sorted(set(back)))


GROVE_PACKAGES = ("grove", "router", "executor", "artifacts", "sandbox_image")


def test_the_kernel_imports_nothing_of_grove_outside_it() -> None:
    for path in sources("grove/core"):
        ours = {n for n in imports(path) if n.split(".")[0] in GROVE_PACKAGES}
        outside = {n for n in ours if not n.startswith("grove.core")}
        assert not outside, f"{path} imports {outside}"


def test_the_sdk_loads_no_server_package() -> None:
    code = ("import sys, grove.client, grove.client.artifacts, grove.client.upload\n"
            "servers = ('router', 'artifacts', 'executor')\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in servers)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "", f"importing grove.client loaded: {done.stdout}"
