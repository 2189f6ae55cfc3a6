"""``/v1/openapi.json``, generated from the route table and the request models."""

from __future__ import annotations

import re
from typing import Any

from grove.core.schema import json_schema

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


def canonical_path(path: str) -> str:
    """A route path without its parameters' regular expressions (``{tail:.*}`` → ``{tail}``), as aiohttp
    names the resource and OpenAPI wants it."""
    return re.sub(r"{(\w+):[^}]*}", r"{\1}", path)


def build_spec(routes: list[Any]) -> dict[str, Any]:
    """The OpenAPI 3.0 document of exactly the routes served."""
    paths: dict[str, dict[str, Any]] = {}
    schemes: dict[str, Any] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for route in routes:
        path = canonical_path(route.path)
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{re.sub(r'[^a-z0-9]+', '_', path.lower()).strip('_')}",
            "responses": {"200": {"description": "ok"}, "default": _ERROR},
        }
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", path)
        ]
        if (query := getattr(route, "query", None)) is not None:
            schema = json_schema(query)
            params += [
                {"name": name, "in": "query", "required": False, "description": prop.pop("description", ""),
                 "schema": prop}
                for name, prop in schema["properties"].items()
            ]
        if params:
            op["parameters"] = params
        if route.body is not None:
            op["requestBody"] = {"content": {"application/json": {"schema": json_schema(route.body)}}}
        elif route.raw_body:
            op["requestBody"] = {"content": {route.raw_body: {"schema": {}}}}
        if not route.public:
            op["security"] = [{"bearer": []}]
        if header := getattr(route, "key_header", None):
            scheme = re.sub(r"\W+", "_", header.lower())
            schemes[scheme] = {"type": "apiKey", "in": "header", "name": header}
            op["security"].append({scheme: []})
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {"title": "grove", "version": "1", "description": "Sandboxes for AI-agent training and evaluation."},
        "paths": paths,
        "components": {"securitySchemes": schemes},
    }
