"""How long the bucket keeps artifacts and trajectories: S3 lifecycle rules that grove owns by their ids.

Artifacts (their bytes and their index entries) and trajectories (records and their index entries)
each get their own expiration, so trajectories can be kept longer than the bulky artifacts, or for
ever. Rules whose id does not start with ``grove-`` are an operator's own and are kept as they are.

On the embedded seaweedfs (``weed mini``) a rule is stored and read back like on MinIO or AWS, but it
takes effect as a TTL stamped on each object when it is written: objects stored before the rule was set
keep no expiry, and shortening, lengthening or removing the rule later does not change the expiry of
objects already written under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minio.commonconfig import ENABLED, Filter
from minio.lifecycleconfig import Expiration, LifecycleConfig, Rule

from artifacts import catalog
from artifacts import trajectory as tj
from artifacts.store import ObjectStore
from grove.core.errors import Invalid

RULE_PREFIX = "grove-"
MAX_DAYS = 36500
# grove's rules: id → the key prefix it expires. Trajectory index entries all start with "index/by-",
# the artifact index with "index/artifacts/": the two never overlap.
ARTIFACT_RULES = {"grove-artifacts": catalog.ARTIFACT_PREFIX, "grove-artifact-index": catalog.INDEX_PREFIX}
TRAJECTORY_RULES = {"grove-trajectories": tj.TRAJECTORY_PREFIX, "grove-trajectory-index": f"{tj.INDEX_PREFIX}by-"}


@dataclass(frozen=True)
class Retention:
    """Days each kind of object is kept: None leaves the bucket's rules for it alone, 0 removes
    grove's rule (kept for ever), N > 0 expires it N days after it was written."""

    artifacts_days: int | None = None
    """Artifacts: pushed files and truncated commands' full outputs, and their index entries."""
    trajectories_days: int | None = None
    """Trajectory records and their index entries."""

    def __post_init__(self) -> None:
        for name, days in (("artifact", self.artifacts_days), ("trajectory", self.trajectories_days)):
            if days is not None and not 0 <= days <= MAX_DAYS:
                raise Invalid(f"{name} retention must be between 0 (keep for ever) and {MAX_DAYS} days, got {days}")

    def wanted(self) -> dict[str, tuple[str, int | None]]:
        """The rules this setting manages: id → (prefix, days; None: remove the rule)."""
        out: dict[str, tuple[str, int | None]] = {}
        for days, rules in ((self.artifacts_days, ARTIFACT_RULES), (self.trajectories_days, TRAJECTORY_RULES)):
            if days is not None:
                out.update({rid: (prefix, days or None) for rid, prefix in rules.items()})
        return out


def apply(store: ObjectStore, retention: Retention) -> bool:
    """Bring grove's lifecycle rules in the bucket in line with ``retention``; True if it changed them."""
    wanted = retention.wanted()
    if not wanted:
        return False
    current = store.lifecycle()
    rules = list(current.rules) if current is not None else []
    kept = [r for r in rules if r.rule_id not in wanted]
    added = [_rule(rid, prefix, days) for rid, (prefix, days) in sorted(wanted.items()) if days is not None]
    if sorted(_summary(rules)) == sorted(_summary(kept + added)):
        return False
    store.set_lifecycle(LifecycleConfig(kept + added))
    return True


def read(store: ObjectStore) -> dict[str, tuple[str, int | None]]:
    """grove's rules in the bucket: id → (prefix, days)."""
    current = store.lifecycle()
    return {rid: (prefix, days) for rid, prefix, days in _summary(list(current.rules) if current else [])
            if rid.startswith(RULE_PREFIX)}


def _rule(rule_id: str, prefix: str, days: int) -> Rule:
    return Rule(ENABLED, rule_filter=Filter(prefix=prefix), rule_id=rule_id, expiration=Expiration(days=days))


def _summary(rules: list[Rule]) -> list[tuple[str, str, int | None]]:
    return [
        (str(r.rule_id or ""), (r.rule_filter.prefix if r.rule_filter else None) or "",
         r.expiration.days if r.expiration else None)
        for r in rules
    ]
