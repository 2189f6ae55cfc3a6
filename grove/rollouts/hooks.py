"""``module:function`` hooks named on the command line or in a task (a judge, a teacher): imported like ``python -m``
would, a module beside the task files included."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from grove.core.errors import Invalid


def resolve_function(spec: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` names; Invalid, naming ``what`` it is for, if there is none."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise Invalid(f"{what} {spec!r}: use module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # like `python -m`: a module beside the task files imports from the CLI too
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Invalid(f"{what} {spec!r}: cannot import {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise Invalid(f"{what} {spec!r}: {module_name} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]
