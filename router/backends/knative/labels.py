"""Kubernetes label syntax: turning free-form sandbox metadata into valid label keys and values.

A label value is at most 63 characters of ``[A-Za-z0-9._-]``, beginning and ending with an alphanumeric
(or empty); the name part of a key the same but never empty. Anything else makes the API server reject
the whole object (422), so metadata is sanitized here and kept verbatim in an annotation beside.
"""

from __future__ import annotations

import hashlib
import re

MAX_VALUE = 63
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_BAD = re.compile(r"[^-A-Za-z0-9_.]+")

#: Labels every grove object carries.
MANAGED_BY = "app.kubernetes.io/managed-by"
SANDBOX = "grove.dev/sandbox"
INSTANCE = "grove.dev/instance"
EGRESS = "grove.dev/egress"
ROLE = "grove.dev/role"
VISIBILITY = "networking.knative.dev/visibility"


def is_valid_value(value: str) -> bool:
    """Whether ``value`` is a valid label value."""
    return len(value) <= MAX_VALUE and bool(_VALUE_RE.match(value))


def sanitize_value(value: str) -> str:
    """A valid label value as close to ``value`` as possible; changed values get a short hash suffix.

    The suffix keeps two different inputs from colliding after sanitizing (``a/b`` and ``a:b``).
    """
    if is_valid_value(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = _BAD.sub("_", value).strip("-_.")[: MAX_VALUE - len(digest) - 1].rstrip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def sanitize_name(name: str) -> str:
    """A valid (non-empty) name part of a label key."""
    return sanitize_value(name) or "x"


def metadata_labels(metadata: dict[str, str]) -> dict[str, str]:
    """Labels for the sandbox's metadata (``task_id`` becomes ``grove.dev/task-id``), values sanitized."""
    return {
        f"grove.dev/{sanitize_name(key.replace('_', '-').lower())}": sanitize_value(value)
        for key, value in metadata.items()
    }
