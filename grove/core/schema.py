"""Typed request models with unknown fields rejected, and their JSON Schema for the OpenAPI document.

Shared by every layer: the router validates its own calls' bodies with it and publishes every model in
``/v1/openapi.json``. A model is a frozen dataclass whose fields carry :func:`spec` metadata (doc and bounds).
:func:`parse` turns a decoded body into the model or raises ``BadRequest``/``Invalid`` naming the field;
:func:`json_schema` describes the same model, so for what the router parses the spec cannot drift from what is
enforced. The exec call is forwarded unparsed and checked by the executor's own parser (a body of up to 256 MiB,
stdin in it, is parsed once, where it is used): its fields and bounds come from :mod:`grove.core.api`, and a test
holds the published bounds to the enforced ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from grove.core.errors import BadRequest, Invalid
from grove.core.wire import non_finite_path

T = TypeVar("T")


def spec(doc: str, *, default: Any = dataclasses.MISSING, minimum: float | None = None,
         maximum: float | None = None, enum: tuple[str, ...] | None = None, max_len: int | None = None,
         max_items: int | None = None, factory: Any = dataclasses.MISSING) -> Any:
    """A documented, bounded model field (``max_len`` of a string, or of each key plus value of a map)."""
    meta = {"doc": doc, "minimum": minimum, "maximum": maximum, "enum": enum, "max_len": max_len,
            "max_items": max_items}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def parse(model: type[T], body: Any, where: str = "body") -> T:
    """Validate ``body`` against ``model``; unknown fields are an error, as are wrong types and bounds."""
    if not isinstance(body, dict):
        raise BadRequest(f"{where} must be an object")
    fields = {f.name: f for f in dataclasses.fields(model)}  # type: ignore[arg-type]
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise BadRequest(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(fields)}")
    hints = _hints(model)  # type: ignore[arg-type]  # a class is hashable; mypy cannot tell for type[T]
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in body or (body[name] is None and _optional(hints[name])):
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise BadRequest(f"{where}: field {name!r} is required")
            continue
        values[name] = _check(hints[name], body[name], f"{where}.{name}" if where != "body" else name, field.metadata)
    return model(**values)


def check_field(model: Any, name: str, value: Any, where: str = "body") -> Any:
    """One field of a body, checked as :func:`parse` checks it, and what ``parse`` would set it to (its
    default when the field is optional and the value null or absent): a batch's items, alike but for
    their request ids, are parsed once and only the field that differs is checked for each."""
    field = _fields(model)[name]
    tp = _hints(model)[name]
    if value is None and _optional(tp):
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        raise BadRequest(f"{where}: field {name!r} is required")
    return _check(tp, value, f"{where}.{name}" if where != "body" else name, field.metadata)


def parse_query(model: type[T], query: Mapping[str, str]) -> T:
    """Validate query parameters against ``model``: numbers and booleans are converted from their text
    first (``1``/``true``/``0``/``false`` for a boolean), then checked like a body."""
    hints = _hints(model)  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for name, text in query.items():
        tp = next((a for a in typing.get_args(hints.get(name)) if a is not type(None)), hints.get(name))
        values[name] = _from_text(tp, text, name)
    return parse(model, values, where="query")


def _from_text(tp: Any, text: str, name: str) -> Any:
    if tp is bool:
        if text.lower() not in ("1", "true", "0", "false"):
            raise BadRequest(f"query parameter {name!r} must be 1, true, 0 or false, got {text!r}")
        return text.lower() in ("1", "true")
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            kind = "an integer" if tp is int else "a number"
            raise BadRequest(f"query parameter {name!r} must be {kind}, got {text!r}") from None
    return text


@functools.cache
def _fields(model: Any) -> dict[str, dataclasses.Field[Any]]:
    """A model's fields by name (once per model)."""
    return {f.name: f for f in dataclasses.fields(model)}


@functools.cache
def _hints(model: Any) -> dict[str, Any]:
    """A model's resolved field types (resolving evaluates every annotation string: once per model, not per request)."""
    return typing.get_type_hints(model)


def _optional(tp: Any) -> bool:
    return type(None) in _shape(tp)[1]


@functools.cache
def _shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """A type's origin and arguments (``typing``'s look-ups, made once per type: every field of every
    request asks, and a batch of 1,000 creates asks a thousand times)."""
    return typing.get_origin(tp), typing.get_args(tp)


def _check(tp: Any, value: Any, name: str, meta: Any) -> Any:
    origin, args = _shape(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if len(args) == 2 and args[1] is type(None):  # `T | None`, the usual optional field: T's check alone
            return _check(args[0], value, name, meta)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(arg, value, name, meta)
            except (BadRequest, Invalid) as exc:
                errors.append(exc)
        raise errors[-1] if len(errors) == 1 else BadRequest(f"{name!r} has the wrong type")
    if tp is str:  # first: the commonest field
        if not isinstance(value, str):
            raise BadRequest(f"{name!r} must be a string")
        if "\x00" in value:
            raise BadRequest(f"{name!r} contains a NUL byte")
        if meta.get("enum") and value not in meta["enum"]:
            raise Invalid(f"{name!r} must be one of {', '.join(meta['enum'])}, got {value!r}")
        if meta.get("max_len") and len(value) > meta["max_len"]:
            raise Invalid(f"{name!r} is longer than {meta['max_len']} characters")
        return value
    if dataclasses.is_dataclass(tp):
        return parse(tp, value, name)  # type: ignore[arg-type]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise BadRequest(f"{name!r} must be an object of string to string")
        if (most := meta.get("max_items")) is not None and len(value) > most:
            raise Invalid(f"{name!r} has {len(value)} entries; at most {most} are allowed")
        if (longest := meta.get("max_len")) is not None:
            for key, item in value.items():
                if len(key) + len(item) > longest:
                    raise Invalid(f"{name!r}: entry {key[:64]!r} is longer than {longest} characters (key and value)")
        return dict(value)
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, list):
            raise BadRequest(f"{name!r} must be a list of objects")
        return [parse(args[0], item, f"{name}[{i}]") for i, item in enumerate(value)]  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadRequest(f"{name!r} must be a list of strings")
        return tuple(value) if origin is tuple else list(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise BadRequest(f"{name!r} must be true or false")
        return value
    if tp in (int, float):
        ok = isinstance(value, int) if tp is int else isinstance(value, int | float)
        if not ok or isinstance(value, bool):
            raise BadRequest(f"{name!r} must be {'an integer' if tp is int else 'a number'}")
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(f"{name!r} must be a finite number, got {value}")
        lo, hi = meta.get("minimum"), meta.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise Invalid(f"{name!r} must be between {_number(lo)} and {_number(hi)}, got {value}")
        return tp(value)
    if tp is bytes:
        if not isinstance(value, bytes):
            raise BadRequest(f"{name!r} must be bytes (msgpack bin) or a string")
        return value
    if tp is typing.Any:
        if (where := non_finite_path(value, name)) is not None:  # msgpack carries NaN and Infinity; JSON cannot
            raise Invalid(f"{where!r} must be a finite number")
        return value
    raise TypeError(f"unsupported model type {tp!r}")  # a bug in a model, not bad input


def json_schema(tp: Any, meta: Any = None) -> dict[str, Any]:
    """JSON Schema of a model or field type (used to generate ``/v1/openapi.json``)."""
    meta = meta or {}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    out: dict[str, Any]
    if origin in (typing.Union, types.UnionType):
        options = [json_schema(a, meta) for a in args if a is not type(None)]
        out = options[0] if len(options) == 1 else {"oneOf": options}
        if type(None) in args:
            out = {**out, "nullable": True}
        return out
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props, required = {}, []
        for f in dataclasses.fields(tp):
            props[f.name] = {**json_schema(hints[f.name], f.metadata), "description": f.metadata.get("doc", "")}
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        out = {"type": "object", "properties": props, "additionalProperties": False}
        if tp.__doc__:
            out["description"] = tp.__doc__.strip().splitlines()[0]
        if required:
            out["required"] = required
        return out
    if origin is dict:
        out = {"type": "object", "additionalProperties": {"type": "string"}}
        if meta.get("max_items") is not None:
            out["maxProperties"] = meta["max_items"]
        return out
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return {"type": "array", "items": json_schema(args[0])}
    if origin in (list, tuple):
        return {"type": "array", "items": {"type": "string"}}
    if tp is bytes:
        return {"type": "string", "format": "binary"}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        out = {"type": simple[tp]}
        for key, name in (("minimum", "minimum"), ("maximum", "maximum"), ("enum", "enum"), ("max_len", "maxLength")):
            if meta.get(key) is not None:
                out[name] = list(meta[key]) if key == "enum" else meta[key]
        return out
    return {}


def _number(value: float | None) -> str:
    """A bound as a person reads it: ``1,048,576``, ``0.5``, never ``1.04858e+06``."""
    if value is None:
        return "any"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"
