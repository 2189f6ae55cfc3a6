"""Reading Knative status: is a Service ready, has it failed and why, where does it answer."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def condition(obj: Obj, kind: str = "Ready") -> Obj | None:
    """The status condition of ``kind``, if the controller reported one."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def observed(obj: Obj) -> bool:
    """Whether the controller has seen the current spec (``observedGeneration == generation``)."""
    generation = obj.get("metadata", {}).get("generation")
    return generation is not None and obj.get("status", {}).get("observedGeneration") == generation


def state(obj: Obj) -> str:
    """``ready``, ``failed`` or ``pending`` — only a condition about the current generation counts."""
    if not observed(obj):
        return "pending"
    ready = condition(obj)
    if ready is None:
        return "pending"
    return {"True": "ready", "False": "failed"}.get(str(ready.get("status")), "pending")


def describe(obj: Obj | None) -> str:
    """``Ready=<status> (<reason>: <message>)`` for messages, or why there is nothing to say."""
    if obj is None:
        return "the Service does not exist"
    ready = condition(obj)
    if ready is None:
        return "no Ready condition reported yet"
    detail = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k))
    return f"Ready={ready.get('status')}" + (f" ({detail})" if detail else "")


def revision_failure(revision: Obj) -> str | None:
    """The most specific failure message of a Revision (its failed conditions, Ready last)."""
    messages = []
    for kind in ("ContainerHealthy", "ResourcesAvailable", "Ready"):
        cond = condition(revision, kind)
        if cond is not None and cond.get("status") == "False" and cond.get("message"):
            text = f"{cond.get('reason') or kind}: {cond['message']}"
            if text not in messages:
                messages.append(text)
    return "; ".join(messages) or None


def image_digest(revision: Obj, container: str) -> str | None:
    """The ``sha256:...`` digest Knative resolved for ``container``'s image, when it did."""
    for item in revision.get("status", {}).get("containerStatuses", []) or []:
        if item.get("name") == container and "@" in str(item.get("imageDigest", "")):
            return str(item["imageDigest"]).rsplit("@", 1)[1]
    return None


def pinned(image: str, digest: str | None) -> str:
    """``image`` pinned to ``digest`` (``repo@sha256:…``), its tag dropped; unchanged without a digest."""
    if "@" in image or not digest:
        return image
    name, _, last = image.rpartition("/")
    repo = last.split(":", 1)[0]
    return f"{name}/{repo}@{digest}" if name else f"{repo}@{digest}"


_STATUS_FIELDS = ("conditions", "observedGeneration", "latestCreatedRevisionName", "latestReadyRevisionName",
                  "address", "url")


def service_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the backend reads of a Knative Service, for the watch cache: a whole Service is ~30 KiB of Python
    objects (its template, managed fields), this is well under 1 KiB."""
    meta, status = obj.get("metadata", {}), obj.get("status") or {}
    containers = obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
    return {
        "metadata": {k: meta[k] for k in ("name", "generation", "labels", "deletionTimestamp", "resourceVersion")
                     if k in meta},
        "spec": {"template": {"spec": {"containers": [{"image": containers[0].get("image", "")}]}}},
        "status": {k: status[k] for k in _STATUS_FIELDS if k in status},
    }


def slice_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """What the backend reads of an EndpointSlice: its service label, ports, and endpoints' addresses."""
    labels = obj.get("metadata", {}).get("labels") or {}
    return {
        "metadata": {"name": obj.get("metadata", {}).get("name", ""),
                     "labels": {k: v for k, v in labels.items() if k == "kubernetes.io/service-name"}},
        "ports": [{"name": p.get("name"), "port": p.get("port")} for p in obj.get("ports") or []],
        "endpoints": [{"addresses": e.get("addresses") or [], "conditions": {"ready": (e.get("conditions") or {})
                                                                             .get("ready")}}
                      for e in obj.get("endpoints") or []],
    }
