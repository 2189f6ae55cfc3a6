"""``artifacts`` imports neither ``executor`` nor ``router``; its snapshot side runs without ``minio``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module a file imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_artifacts_imports_neither_executor_nor_router() -> None:
    for path in sorted(ARTIFACTS.glob("*.py")):
        assert not imported_modules(path) & {"executor", "router"}, path.name


def test_snapshot_modules_load_without_minio() -> None:
    # What the executor uses inside a sandbox, whose runtime bundle has no minio (nor urllib3).
    code = (
        "import sys; sys.modules['minio'] = None; sys.modules['urllib3'] = None\n"
        "import artifacts.snapshot, artifacts.presigned, artifacts.unpack\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ARTIFACTS.parent)
