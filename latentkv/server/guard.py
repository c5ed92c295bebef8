"""ASGI middleware that runs before any route: the API key, the body-size limit and a
strict JSON check, each answering in OpenAI's error format.

Pure ASGI (no BaseHTTPMiddleware) so streaming responses still see client disconnects.
The body is read (at most `max_bytes`, refused before reading when Content-Length says
more), checked once with a strict parser — no NaN/Infinity, no lone surrogates, not
empty — and replayed to the app unchanged.
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path

from latentkv.server.errors import error_body
from latentkv.settings import DEFAULT_MAX_REQUEST_BYTES

PUBLIC_PATHS = ("/health",)
API_KEY_ENV = "LATENTKV_API_KEY"


def resolve_api_key(flag: str | None, key_file: str | None, environ=os.environ) -> str | None:
    """The API key from --api-key (visible in `ps`), else --api-key-file, else $LATENTKV_API_KEY.
    Raises ValueError for an unreadable or empty key file."""
    if flag:
        return flag
    if key_file:
        try:
            key = Path(key_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"--api-key-file {key_file}: cannot read it ({err})") from None
        if not key:
            raise ValueError(f"--api-key-file {key_file}: the file is empty")
        return key
    return environ.get(API_KEY_ENV) or None


async def send_error(
    send,
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict | None = None,
) -> None:
    body = json.dumps(error_body(message, type_, param, code)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class ApiKeyGuard:
    """With a key set, every path but /health (and /metrics when `metrics_public`) needs
    'Authorization: Bearer KEY' — /docs and /openapi.json included."""

    def __init__(self, app, api_key: str | None, metrics_public: bool = False):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.public = PUBLIC_PATHS + (("/metrics",) if metrics_public else ())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.api_key is None or scope["path"] in self.public:
            return await self.app(scope, receive, send)
        given = header(scope, b"authorization") or ""
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key):
            return await self.app(scope, receive, send)
        message = "missing API key" if not given else "invalid API key"
        await send_error(
            send,
            401,
            f"{message}: send 'Authorization: Bearer <key>'",
            "authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def find_lone_surrogate(value, path: str = "") -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate (unencodable as UTF-8)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "body"
        elif isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(item))
    return None


def check_json(body: bytes) -> tuple[str, str | None, str] | None:
    """-> (message, param, code) when the body is not acceptable JSON, else None."""
    if not body.strip():
        return "the request body is empty; send a JSON object", None, "missing_required_parameter"
    try:
        value = json.loads(body, parse_constant=reject_constant)
    except UnicodeDecodeError as err:
        return f"the request body is not UTF-8: {err}", None, "invalid_json"
    except ValueError as err:
        return f"malformed JSON body: {err}", None, "invalid_json"
    where = find_lone_surrogate(value)
    if where is not None:
        return f"{where}: a string holds a lone surrogate (not valid Unicode text)", where, "invalid_value"
    return None


class BodyGuard:
    """Limits request bodies to `max_bytes`; checks the JSON of POSTs to `json_paths` before parsing."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES, json_paths: tuple[str, ...] = ()):
        self.app = app
        self.max_bytes = max_bytes
        self.json_paths = json_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = f"the request body is larger than the limit of {self.max_bytes} bytes (--max-request-bytes)"
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, too_big, "invalid_request_error", code="request_too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_error(send, 413, too_big, "invalid_request_error", code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = check_json(body) if scope["method"] == "POST" and scope["path"] in self.json_paths else None
        if problem is not None:
            message, param, code = problem
            return await send_error(send, 400, message, "invalid_request_error", param, code)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then disconnects, as the app expects

        await self.app(scope, replay, send)
