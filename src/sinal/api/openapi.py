"""The OpenAPI document: request bodies the routes read themselves, problem answers,
and the bearer-key security scheme."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from sinal.api.errors import ProblemBody

_REF = "#/components/schemas/{model}"


def body_of(model: type[BaseModel] | str, *, required: bool = True) -> dict[str, Any]:
    """`openapi_extra` declaring a JSON request body of `model` (parsed by the route)."""
    name = model if isinstance(model, str) else model.__name__
    schema = {"$ref": _REF.format(model=name)}
    return {
        "requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}
    }


def build_openapi(app: FastAPI, models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """The document, with the request models and ProblemBody in its components."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    all_models: tuple[type[BaseModel], ...] = (*models, ProblemBody)
    for model in all_models:
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    if "BatchIn" in schemas:
        events = schemas["BatchIn"]["properties"]["events"]
        events["items"] = {"$ref": _REF.format(model="EventIn")}
    doc["components"]["securitySchemes"] = {
        "apiKey": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key from `sinal keys create`: snl_<account>_<secret>",
        }
    }
    for path, operations in doc.get("paths", {}).items():
        if path.startswith("/v1/"):
            for operation in operations.values():
                operation["security"] = [{"apiKey": []}]
    app.openapi_schema = doc
    return doc
