"""Pulling an image from a registry with Debian's ``skopeo``: auth, platform choice and digest checks.

grove does not speak the distribution protocol itself: ``skopeo`` does, with the auth users already
have (anonymous, bearer-token challenges, basic, ``~/.docker/config.json``, ``REGISTRY_AUTH_FILE``,
``--authfile``) and a digest check on every blob it writes. A pull is two calls:

1. ``skopeo inspect --raw`` reads what the reference points to. If that is an image index, grove picks
   the manifest for the platform asked for (default: this host's). The digest kept is the registry's
   digest of that manifest, the one ``docker pull`` prints and a registry serves it by.
2. ``skopeo copy docker://REPO@DIGEST oci:DIR`` copies exactly that manifest (a tag moving meanwhile
   cannot change what is copied), its config and its layers into an OCI layout whose blobs go to a
   directory shared by every pull: a blob fetched once — also by a pull that failed or was killed
   half way — is never fetched again.
"""

from __future__ import annotations

import hashlib
import json
import platform as host_platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.core.errors import BadGateway, GroveError, Invalid, NotFound
from router.backends.local.references import Reference

_INSPECT_TIMEOUT_S = 300.0
_INDEX_KEYS = ("manifests",)


@dataclass(frozen=True)
class PullOptions:
    """How to reach the registry and which platform to take."""

    platform: str | None = None
    """``os/arch[/variant]``; None is this host's (``linux/amd64`` on x86_64)."""
    insecure: bool = False
    """Allow plain HTTP and unverified TLS (for a registry on loopback)."""
    authfile: Path | None = None
    """A containers-auth.json / docker config.json to read credentials from (default: skopeo's search)."""
    quiet: bool = False
    """No progress lines (a pull made by the router, whose output is its log)."""


@dataclass(frozen=True)
class PullPolicy:
    """Whether and how the local backend pulls an image a create names but the store lacks."""

    insecure: tuple[str, ...] = ()
    """Registries (``host:port``) reached over plain HTTP."""

    def options(self, registry: str) -> PullOptions:
        """The options for a pull from ``registry``."""
        return PullOptions(insecure=registry in self.insecure, quiet=True)


@dataclass(frozen=True)
class Pulled:
    """An image copied into an OCI layout, its blobs in the shared blob directory."""

    digest: str
    """The registry's ``sha256:`` digest of the platform's manifest."""
    index_digest: str | None
    """The digest of the image index the reference named, if it named one."""
    config: dict[str, Any]
    """The image's config (``config``, ``rootfs.diff_ids``, ``architecture``, ...)."""
    layers: list[Path]
    """The layer blobs (compressed as in the registry), lowest first."""
    diff_ids: list[str]
    """The digests of the uncompressed layers, lowest first (from the config)."""
    manifest_blob: str
    """The digest of the manifest as the OCI layout holds it (skopeo converts Docker manifests to OCI)."""
    config_blob: str
    """The digest of the config blob."""


def host_platform_name() -> str:
    """This host's platform as registries name it."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(host_platform.machine(), host_platform.machine())
    return f"linux/{arch}"


def pull(ref: Reference, blobs: Path, layout: Path, options: PullOptions) -> Pulled:
    """Copy ``ref`` into the new OCI layout ``layout`` (blobs in ``blobs``); errors name the registry's answer."""
    raw = _skopeo(["inspect", "--raw", *_source_flags(options, "")], ref)
    top_digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    doc = _json(raw, f"the registry's answer for {ref.given}")
    index_digest = None
    digest = ref.digest if ref.digest is not None and ref.digest == top_digest else top_digest
    if any(k in doc for k in _INDEX_KEYS):
        index_digest = top_digest
        digest = _pick(doc, options.platform or host_platform_name(), ref)
    elif doc.get("schemaVersion") == 1:
        raise Invalid(f"{ref.given} is a schema 1 image, which registries deprecated in 2017; push it again")
    _skopeo(
        ["copy", *(["--quiet"] if options.quiet else []), "--dest-shared-blob-dir", str(blobs),
         *_source_flags(options, "src-"),
         f"docker://{ref.at(digest)}", f"oci:{layout}:image"],
        ref,
    )
    return _read_layout(layout, blobs, digest, index_digest)


def _source_flags(options: PullOptions, prefix: str) -> list[str]:
    flags = [f"--{prefix}tls-verify=false"] if options.insecure else []
    if options.authfile is not None:
        flags.append(f"--{prefix}authfile={options.authfile}")
    return flags


def _pick(index: dict[str, Any], wanted: str, ref: Reference) -> str:
    """The digest of the index's manifest for ``wanted`` (``os/arch[/variant]``)."""
    parts = wanted.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise Invalid(f"invalid platform {wanted!r}: expected os/arch or os/arch/variant, e.g. linux/arm64")
    found = []
    for item in index.get("manifests") or []:
        plat = item.get("platform") or {} if isinstance(item, dict) else {}
        have = [plat.get("os"), plat.get("architecture"), plat.get("variant")]
        found.append("/".join(str(p) for p in have if p))
        if have[:2] == parts[:2] and (len(parts) == 2 or have[2] == parts[2]):
            digest = item.get("digest")
            if isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                return digest
    raise NotFound(f"{ref.given} has no image for {wanted}; it has {', '.join(found) or 'none'} (use --platform)")


def _read_layout(layout: Path, blobs: Path, digest: str, index_digest: str | None) -> Pulled:
    index = _json((layout / "index.json").read_bytes(), "the pulled layout's index.json")
    manifest_blob = index["manifests"][0]["digest"]
    manifest = _json(_blob(blobs, manifest_blob).read_bytes(), "the pulled manifest")
    config_blob = manifest["config"]["digest"]
    config = _json(_blob(blobs, config_blob).read_bytes(), "the pulled image config")
    layers = [_blob(blobs, d["digest"]) for d in manifest.get("layers") or []]
    diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
    if len(diff_ids) != len(layers):
        raise Invalid(f"image {digest}: its config lists {len(diff_ids)} layers, its manifest {len(layers)}")
    return Pulled(digest, index_digest, config, layers, diff_ids, manifest_blob, config_blob)


def _blob(blobs: Path, digest: str) -> Path:
    algo, _, hexa = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexa):
        raise Invalid(f"unsupported or malformed digest {digest!r} in the pulled image")
    return blobs / algo / hexa


def _json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise BadGateway(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadGateway(f"{what} is not a JSON object")
    return doc


def _skopeo(args: list[str], ref: Reference) -> bytes:
    """Run skopeo on ``ref``; its failures become grove errors quoting the registry's answer."""
    argv = ["skopeo", *args]
    if args[0] == "inspect":
        argv.append(f"docker://{ref.given}")
    try:
        # A copy's progress ("Copying blob ...") goes to the caller's stdout as skopeo writes it.
        inspect = args[0] == "inspect"
        done = subprocess.run(argv, stdout=subprocess.PIPE if inspect else None, stderr=subprocess.PIPE,
                              check=False, timeout=_INSPECT_TIMEOUT_S if inspect else None)
    except FileNotFoundError:
        raise GroveError("skopeo is not installed: apt-get install -y skopeo") from None
    if done.returncode == 0:
        return done.stdout or b""
    raise _error(ref, done.stderr.decode(errors="replace"))


def _error(ref: Reference, stderr: str) -> GroveError:
    quoted = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    answer = (quoted[-1] if quoted else stderr.strip().splitlines()[-1] if stderr.strip() else "no output")
    answer = answer.replace('\\"', '"')
    where = f"pulling {ref.given} from {ref.registry}"
    low = answer.lower()
    if "manifest unknown" in low or "name unknown" in low or "not found" in low:
        return NotFound(f"{where}: the registry has no such image (404: {answer})")
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return BadGateway(
            f"{where}: the registry refused the credentials (401 Unauthorized: {answer}); log in to "
            f"{ref.registry} (~/.docker/config.json, REGISTRY_AUTH_FILE) or pass --authfile/--username"
        )
    if "digest did not match" in low:
        return BadGateway(f"{where}: a blob did not match its digest, so it was refused ({answer})")
    if "http response to https client" in low:
        return BadGateway(f"{where}: the registry speaks plain HTTP ({answer}); pass --insecure for loopback")
    return BadGateway(f"{where} failed: {answer}")
