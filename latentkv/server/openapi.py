"""The OpenAPI document, made to say what the server does: validation errors are 400 (not
FastAPI's 422) in OpenAI's error shape, 401/404/413/500/503 are listed where they can
happen, /metrics is text/plain, and the bearer key is declared when one is required."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
WHY = {
    400: "invalid request (OpenAI error format, with param and code)",
    401: "missing or wrong API key",
    404: "unknown model (code model_not_found)",
    413: "request body over --max-request-bytes",
    500: "the request failed in the engine",
    503: "busy or shutting down (Retry-After), or the engine stopped",
}
USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    },
}
NULLABLE_OBJECT = {"type": ["object", "null"]}
FINISH = {"enum": ["stop", "length"]}
CHAT_FINISH = {"enum": ["stop", "length", "tool_calls"]}
TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "max_model_len"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "max_model_len": {"type": "integer", "minimum": 1},
    },
}
STOP_REASON = {"type": ["integer", "string", "null"]}


def response_schema(object_name: str, choice: dict, finish: dict = FINISH) -> dict:
    """A non-streamed completion or chat completion."""
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": object_name},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "usage": USAGE,
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "finish_reason", *choice],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "logprobs": NULLABLE_OBJECT,
                        "finish_reason": finish,
                        "stop_reason": STOP_REASON,
                        **choice,
                    },
                },
            },
        },
    }


SUCCESS = {
    "/v1/completions": response_schema("text_completion", {"text": {"type": "string"}}),
    "/v1/chat/completions": response_schema(
        "chat.completion",
        {
            "message": {
                "type": "object",
                "required": ["role", "content", "refusal"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "refusal": {"type": "null"},
                    "tool_calls": {"type": "array", "items": TOOL_CALL},
                },
            }
        },
        CHAT_FINISH,
    ),
    "/v1/models": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
    },
    "/v1/models/{model}": MODEL,
}
# one server-sent event: `data:` holds a JSON chunk, or "[DONE]" last
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
HEALTH_SCHEMA = {
    "type": "object",
    "required": ["status"],
    "properties": {"status": {"type": "string"}, "detail": {"type": ["string", "null"]}},
}


def error_response(status: int) -> dict:
    return {"description": WHY[status], "content": {"application/json": {"schema": ERROR_REF}}}


def openapi_document(app: FastAPI, api_key_required: bool) -> dict:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for path, ops in doc["paths"].items():
        for op in ops.values():
            responses = op["responses"]
            responses.pop("422", None)
            statuses = [401] if api_key_required and path != "/health" else []
            if path.startswith("/v1/"):
                statuses += [500]
            if op.get("requestBody"):
                statuses += [400, 404, 413, 503]
            elif "{model}" in path:
                statuses += [404]
            for status in statuses:
                responses[str(status)] = error_response(status)
            if path in SUCCESS:
                responses["200"]["content"]["application/json"]["schema"] = SUCCESS[path]
            if op.get("requestBody"):  # the body is JSON, or server-sent events when "stream": true
                responses["200"]["content"]["text/event-stream"] = {"schema": SSE_EVENT}
    doc["paths"]["/metrics"]["get"]["responses"]["200"] = {
        "description": "Prometheus text format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    doc["paths"]["/health"]["get"]["responses"] = {
        "200": {"description": "serving", "content": {"application/json": {"schema": HEALTH_SCHEMA}}},
        "503": {"description": "the engine loop stopped", "content": {"application/json": {"schema": HEALTH_SCHEMA}}},
    }
    if api_key_required:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
        doc["paths"]["/health"]["get"]["security"] = []
    return doc


def install_openapi(app: FastAPI, api_key_required: bool) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, api_key_required)
        return app.openapi_schema

    app.openapi = openapi
