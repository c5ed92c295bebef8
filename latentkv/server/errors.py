"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}
CODES = {
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    500: "internal_error",
    503: "overloaded",
}

# pydantic error type -> OpenAI-style error code
VALIDATION_CODES = {
    "missing": "missing_required_parameter",
    "json_invalid": "invalid_json",
    "model_attributes_type": "invalid_type",
    "dict_type": "invalid_type",
}


class ApiError(Exception):
    """An error answered with `status` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
        type_: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.type = type_ or TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def validation_code(error_type: str) -> str:
    if error_type in VALIDATION_CODES:
        return VALIDATION_CODES[error_type]
    return "invalid_type" if error_type.endswith("_type") or error_type == "union_tag_invalid" else "invalid_value"


def describe_validation(err: RequestValidationError) -> tuple[str, str | None, str]:
    """One readable message, the offending field and an error code from FastAPI's validation errors."""
    errors = err.errors()
    if not errors:
        return "invalid request", None, "invalid_value"
    # a union reports one error per member; a bound broken inside the member that fits the
    # value's type ("le" in list[int]) says more than "not a string" from the others
    first = min(errors, key=lambda e: (str(e.get("type", "")).endswith("_type"), -len(e.get("loc", ()))))
    kind = str(first.get("type"))
    if kind == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None, "invalid_json"
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # union members show up as loc parts such as "str" or "list[int]"; keep the field path
    param = ".".join(p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool"))
    if kind == "missing":
        if not param:
            return "the request body is empty; send a JSON object", None, "missing_required_parameter"
        return f"missing required field {param!r}", param, "missing_required_parameter"
    message = f"{param or 'body'}: {first.get('msg')}"
    if "input" in first and kind != "model_attributes_type":
        message += f" (got {first['input']!r})"[:300]
    return message, param or None, validation_code(kind)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, including FastAPI's own, in OpenAI's error format."""

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, err: RequestValidationError):
        message, param, code = describe_validation(err)
        return JSONResponse(error_body(message, "invalid_request_error", param, code), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException):
        return JSONResponse(
            error_body(
                str(err.detail), TYPES.get(err.status_code, "invalid_request_error"), code=CODES.get(err.status_code)
            ),
            status_code=err.status_code,
            headers=getattr(err, "headers", None),
        )

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, err: Exception):
        return JSONResponse(internal_error_body(err), status_code=500)


def internal_error_body(err: BaseException) -> dict:
    return error_body(f"internal error: {type(err).__name__}: {err}", "server_error", code="internal_error")
