"""The FastAPI app: routes, API-key check, status counting, engine loop lifecycle."""
from __future__ import annotations

import asyncio
import hmac
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from latentkv.server.async_engine import AsyncEngine
from latentkv.server.chat import create_chat_completion
from latentkv.server.completions import create_completion
from latentkv.server.errors import ApiError, install_error_handlers
from latentkv.server.metrics import ServerMetrics
from latentkv.server.protocol import ChatCompletionRequest, CompletionRequest
from latentkv.server.serving import ServerState


class CountStatus:
    """ASGI middleware counting /v1 responses by status code (pure ASGI, so streaming
    responses still see client disconnects)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.count_status(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


async def unless_disconnected(request: Request, work):
    """Run a handler; if the client goes away first, cancel it (which aborts its
    engine requests). Streaming responses see disconnects by themselves."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)  # nobody is listening
    finally:
        task.cancel()


def build_state(engine, served_model_name: str, max_waiting_requests: int = 256, api_key: str | None = None) -> ServerState:
    """Wrap an `LLMEngine` for serving (the engine loop starts with the app)."""
    holder: dict = {}
    metrics = ServerMetrics(lambda: holder["engine"].stats)
    async_engine = AsyncEngine(engine, on_finish=metrics.count_finished)
    holder["engine"] = async_engine
    return ServerState(engine=async_engine, metrics=metrics, served_model_name=served_model_name,
                       max_model_len=engine.max_model_len, max_num_seqs=engine.args.max_num_seqs,
                       max_waiting_requests=max_waiting_requests, api_key=api_key)


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="latentkv", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(CountStatus, metrics=state.metrics)

    def check_api_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            message = "missing API key" if not header else "invalid API key"
            raise ApiError(401, f"{message}: send 'Authorization: Bearer <key>'", code="invalid_api_key")

    guarded = [Depends(check_api_key)]

    @app.get("/health")
    async def health():
        if not state.engine.alive:
            return JSONResponse({"status": "error", "detail": state.engine.error}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=guarded)
    async def models():
        return {"object": "list", "data": [{
            "id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "latentkv",
            "max_model_len": state.max_model_len}]}

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(req: CompletionRequest, request: Request):
        return await unless_disconnected(request, create_completion(req, state))

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await unless_disconnected(request, create_chat_completion(req, state))

    return app
