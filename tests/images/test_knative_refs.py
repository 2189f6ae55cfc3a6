"""On a cluster nothing is pulled by grove: the reference a create names reaches the Knative Service as given
(the kubelet pulls it; the revision's resolved digest is recorded, see tests/knative/test_backend.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

GROVE_BIN = str(Path(sys.executable).with_name("grove"))


@pytest.mark.parametrize("ref", [
    "127.0.0.1:5000/swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
    "ghcr.io/org/task@sha256:" + "a" * 64,
    "python:3.11-slim",
])
def test_the_manifest_carries_the_reference_unchanged(ref: str) -> None:
    done = subprocess.run([GROVE_BIN, "knative", "manifest", "--image", ref, "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    service = next(o for o in json.loads(done.stdout) if o["kind"] == "Service")
    containers = {c["name"]: c["image"] for c in service["spec"]["template"]["spec"]["containers"]}
    assert containers["sandbox"] == ref
