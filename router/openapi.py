"""``/v1/openapi.json``, generated from the route table and the request models."""

from __future__ import annotations

import re
from typing import Any, Protocol

from router.schema import json_schema

_ERROR = {
    "description": "error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        "required": ["code", "message"],
                    }
                },
                "required": ["error"],
            }
        }
    },
}


class _RouteLike(Protocol):
    method: str
    path: str
    summary: str
    body: type | None
    public: bool
    raw_body: str | None


def build_spec(routes: list[Any]) -> dict[str, Any]:
    """The OpenAPI 3.0 document of exactly the routes served."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{re.sub(r'[^a-z0-9]+', '_', route.path.lower()).strip('_')}",
            "responses": {"200": {"description": "ok"}, "default": _ERROR},
        }
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", route.path)
        ]
        if params:
            op["parameters"] = params
        if route.body is not None:
            op["requestBody"] = {"content": {"application/json": {"schema": json_schema(route.body)}}}
        elif route.raw_body:
            op["requestBody"] = {"content": {route.raw_body: {"schema": {}}}}
        if not route.public:
            op["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {"title": "grove", "version": "1", "description": "Sandboxes for AI-agent training and evaluation."},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
