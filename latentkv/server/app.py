"""The FastAPI app: routes, guards (API key, body limit), status counting, engine loop lifecycle."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from latentkv.server.async_engine import AsyncEngine
from latentkv.server.chat_completions import create_chat_completion
from latentkv.server.completions import create_completion
from latentkv.server.errors import install_error_handlers
from latentkv.server.guard import ApiKeyGuard, BodyGuard
from latentkv.server.metrics import ServerMetrics
from latentkv.server.openapi import install_openapi
from latentkv.server.protocol import ChatCompletionRequest, CompletionRequest
from latentkv.server.serving import ServerState
from latentkv.server.shutdown import Drain, DrainGate, close_engine
from latentkv.settings import DEFAULT_MAX_REQUEST_BYTES


class CountStatus:
    """ASGI middleware counting /v1 responses by status code (pure ASGI, so streaming
    responses still see client disconnects). It sits outside every other middleware, so
    401/413 answers count too, and so does a 500 that an exception turns into outside it."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)

        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.count_status(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # Starlette's outermost handler will answer 500
                self.metrics.count_status(500)
            raise


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


def build_state(
    engine,
    served_model_name: str,
    max_waiting_requests: int = 256,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    metrics_public: bool = False,
    shutdown_timeout: float = 30.0,
) -> ServerState:
    """Wrap an `LLMEngine` for serving (the engine loop starts with the app; when the app stops,
    the engine's KV store queue is written out, within `shutdown_timeout` seconds)."""
    holder: dict = {}
    metrics = ServerMetrics(lambda: holder["engine"].stats)
    async_engine = AsyncEngine(engine, on_finish=metrics.count_finished)
    holder["engine"] = async_engine
    return ServerState(
        engine=async_engine,
        metrics=metrics,
        served_model_name=served_model_name,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.args.max_num_seqs,
        max_waiting_requests=max_waiting_requests,
        api_key=api_key,
        vocab_size=engine.cfg.vocab_size,
        max_request_bytes=max_request_bytes,
        metrics_public=metrics_public,
        drain=Drain(shutdown_timeout),
    )


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()
            # the blocks still queued for the store would be lost with the process
            close_engine(state.engine.engine, state.drain.timeout)

    app = FastAPI(title="latentkv", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    install_openapi(app, api_key_required=state.api_key is not None)
    # added last = runs first: count, then the key, then the body limit and JSON check
    app.add_middleware(
        BodyGuard, max_bytes=state.max_request_bytes, json_paths=("/v1/completions", "/v1/chat/completions")
    )
    app.add_middleware(ApiKeyGuard, api_key=state.api_key, metrics_public=state.metrics_public)
    app.add_middleware(DrainGate, drain=state.drain)  # shutting down: 503 before anything else
    app.add_middleware(CountStatus, metrics=state.metrics)

    @app.get("/health")
    async def health():
        if state.drain.draining:  # not ready: a load balancer should send the next request elsewhere
            return JSONResponse({"status": "draining"}, status_code=503)
        if not state.engine.alive:
            return JSONResponse({"status": "error", "detail": state.engine.error}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    def model_card() -> dict:
        return {
            "id": state.served_model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "latentkv",
            "max_model_len": state.max_model_len,
        }

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")  # (:path: served names may hold slashes, "org/model")
    async def retrieve_model(model: str):
        state.check_model(model)
        return model_card()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await unless_disconnected(request, create_completion(req, state))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await unless_disconnected(request, create_chat_completion(req, state))

    return app
