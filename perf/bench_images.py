"""Layered images: disk bytes for images sharing a base, and create → ready for layered against flattened.

``python -m perf.bench_images [--n 20] [--images 10]`` works on a private state dir:

1. **Disk.** ``--images`` task images that share a base (busybox plus 16 MiB of incompressible data)
   and differ by one small layer each go into the layer store the way a pull puts them there
   (:meth:`ImageStore.add_layered`, what ``grove image pull`` calls once skopeo has the blobs), and the
   same images into the flattened store (``grove image import`` of their OCI tarballs). Bytes on disk
   of each (``du``: allocated blocks, hardlinks once).
2. **Create → ready.** The real local backend (runtime bundle, zygote, cgroups, user namespaces) creates
   sandboxes from three images with the same files: one flattened layer, 5 layers and 50 layers (which
   the store stacks as 24: see ``MAX_LAYERS`` in :mod:`router.backends.local.images`).
   Interleaved (each round the three in a shuffled order) so all three see the same machine load; each
   is deleted at once.

Writes ``perf/results/images.json`` and the "Layered images" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import os
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.common import MIB, Target, machine, machine_line, publish, summarize, target_table, utc_now
from router.backends.base import Network, SandboxSpec
from router.backends.local.backend import LocalBackend
from router.backends.local.images import ImageStore, LayerSource
from router.records.registry import new_id
from tests.support.imagetools import layer_tar, make_busybox_rootfs, make_oci_layout_tar, tar_directory
from tests.support.registry import du

NAME = "images"
SECTION = "## Layered images: shared layers on disk, create → ready"
_TARGET_RATIO = 1.2


def _sources(work: Path, tars: list[bytes], tag: str) -> list[LayerSource]:
    out = []
    for i, tar in enumerate(tars):
        blob = work / f"{tag}-{i}.tar.gz"
        blob.write_bytes(gzip.compress(tar, compresslevel=1, mtime=0))
        out.append(LayerSource(blob, "sha256:" + hashlib.sha256(tar).hexdigest()))
    return out


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def measure_disk(work: Path, images: int) -> dict[str, Any]:
    """Bytes on disk of ``images`` images sharing a base, layered and flattened."""
    big = layer_tar({"opt": None, "opt/base.bin": os.urandom(16 * MIB)})
    base = [tar_directory(make_busybox_rootfs(work / "base")), big]
    layered, flat = ImageStore(work / "layered" / "images"), ImageStore(work / "flat" / "images")
    for n in range(images):
        tars = [*base, layer_tar({f"task{n}": os.urandom(64 * 1024)})]
        layered.add_layered(f"task{n}", _digest(f"task{n}"), _sources(work, tars, f"task{n}"), "bench")
        tarball = make_oci_layout_tar(work / f"task{n}.tar", tars)
        flat.import_image(f"task{n}", tarball)
        tarball.unlink()
    layered_bytes, flat_bytes = du(layered.root / "layers"), du(flat.root)
    return {"images": images, "layered_bytes": layered_bytes, "flattened_bytes": flat_bytes,
            "ratio": round(flat_bytes / layered_bytes, 2)}


def _spec(image: str) -> SandboxSpec:
    return SandboxSpec(id=new_id(), image=image, cpu=1.0, memory_mb=512, pids_max=256, env={},
                       workdir="/workspace", network=Network(), token=secrets.token_urlsafe(16))


def _images(store: ImageStore, work: Path) -> None:
    """``flat``, ``layers5`` and ``layers50``: the same files (busybox and 50 small directories)."""
    rootfs = make_busybox_rootfs(work / "rootfs")
    extra = [{f"d{i}": None, f"d{i}/f": f"{i}\n".encode() * 100} for i in range(50)]
    for i, layer in enumerate(extra):
        (rootfs / f"d{i}").mkdir()
        (rootfs / f"d{i}" / "f").write_bytes(layer[f"d{i}/f"])  # type: ignore[arg-type]
    store.import_image("flat", rootfs)
    busybox = tar_directory(make_busybox_rootfs(work / "bb"))
    for count in (5, 50):
        per = len(extra) // (count - 1)
        groups = [extra[i * per:(i + 1) * per] for i in range(count - 1)]
        tars = [busybox] + [layer_tar({k: v for layer in group for k, v in layer.items()}) for group in groups]
        store.add_layered(f"layers{count}", _digest(f"layers{count}"), _sources(work, tars, f"l{count}"), "bench")


async def measure_create(state: Path, work: Path, n: int) -> dict[str, Any]:
    """create → ready p50/p99 for the flattened and the layered images, interleaved."""
    backend = LocalBackend(state)
    await backend.open()
    try:
        await asyncio.to_thread(_images, backend.images, work)
        names = ("flat", "layers5", "layers50")
        for name in names:  # warm-up: the zygote, the disk template, the page cache
            spec = _spec(name)
            started = await backend.create(spec)
            await backend.delete(spec.id, started.handle)
        times: dict[str, list[float]] = {name: [] for name in names}
        order = list(names)
        for _ in range(n):
            random.shuffle(order)  # no image always follows the same one's delete
            for name in order:
                spec = _spec(name)
                t0 = time.perf_counter()
                started = await backend.create(spec)
                times[name].append(time.perf_counter() - t0)
                await backend.delete(spec.id, started.handle)
        return {name: summarize(samples) for name, samples in times.items()}
    finally:
        await backend.close()


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    d, c = report["disk"], report["create"]
    lines = [
        SECTION, "",
        f"`python -m perf.bench_images --n {report['n']} --images {d['images']}` — {report['date']}. "
        + machine_line(report["machine"]), "",
        *target_table(rows), "",
        f"Disk: {d['images']} images sharing a base (busybox + 16 MiB), each with its own 64 KiB layer: "
        f"{d['layered_bytes'] / MIB:.1f} MiB in the layer store against {d['flattened_bytes'] / MIB:.1f} MiB "
        f"flattened ({d['ratio']}x). Compressed blobs a pull keeps for reuse come on top (about the compressed "
        "size of each distinct layer once).", "",
        "| image | create → ready p50 | p99 |", "|---|---|---|",
        *(f"| {name} | {c[name]['p50_ms']:.0f} ms | {c[name]['p99_ms']:.0f} ms |" for name in c), "",
        "A sandbox mounts each directory holding its layers once, idmapped (for a pulled image: the layer "
        "store, one mount for any depth), and names the layers through short symlinks. Depth still costs: "
        "with 50 layers stacked a start took 1.25x the flattened image's (an earlier run of this benchmark, "
        "before the cap), most likely overlayfs walking every layer for each name it looks up. So a sandbox "
        "stacks at most 24 layers: a deeper image (like `layers50` here) keeps its lowest 23 — where a "
        "shared base is — and has the rest merged into one at pull. Runs on this shared 2-CPU machine vary "
        "by ±15% between runs; the three images are interleaved so each run compares like with like.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both parts and publish."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20, help="creates per image")
    parser.add_argument("--images", type=int, default=10, help="images sharing a base")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grove-bench-images-"))
    try:
        disk = measure_disk(work / "disk", args.images)
        create = asyncio.run(measure_create(work / "state", work / "create", args.n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    flat = create["flat"]["p50_ms"]
    rows = [
        Target(f"disk, {args.images} images sharing a base: flattened / layered", f"{disk['ratio']}x", "—", None),
        *(Target(f"create → ready p50, {name} / flat", f"{create[name]['p50_ms'] / flat:.2f}x "
                 f"({create[name]['p50_ms']:.0f} vs {flat:.0f} ms)", f"≤ {_TARGET_RATIO}x",
                 create[name]["p50_ms"] <= _TARGET_RATIO * flat) for name in ("layers5", "layers50")),
    ]
    report = {"date": utc_now(), "machine": machine(), "n": args.n, "disk": disk, "create": create}
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
