"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """An error answered with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None, type_: str | None = None):
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


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def describe_validation(err: RequestValidationError) -> tuple[str, str | None]:
    """One readable message (and the offending field) from FastAPI's validation errors."""
    errors = err.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # union members show up as loc parts such as "str" or "list[int]"; keep the field path
    param = ".".join(p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool"))
    if first.get("type") == "missing":
        return f"missing required field {param!r}", param or None
    message = f"{param or 'body'}: {first.get('msg')}"
    if "input" in first and first.get("type") != "model_attributes_type":
        message += f" (got {first['input']!r})"[:300]
    return message, param or None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, including FastAPI's own, in OpenAI's error format."""

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, err: RequestValidationError):
        message, param = describe_validation(err)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException):
        return JSONResponse(error_body(str(err.detail), TYPES.get(err.status_code, "invalid_request_error")),
                            status_code=err.status_code, headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, err: Exception):
        return JSONResponse(error_body(f"internal error: {type(err).__name__}: {err}", "server_error"), status_code=500)
