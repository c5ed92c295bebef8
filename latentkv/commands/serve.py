"""`latentkv serve [MODEL]`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import gc
import sys

import uvicorn

from latentkv.commands.startup import log, start_engine
from latentkv.server.app import build_app, build_state
from latentkv.server.guard import resolve_api_key
from latentkv.server.shutdown import ENDING_GRACE, DrainingServer
from latentkv.settings import add_engine_arguments, settings_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over the OpenAI API (HTTP)",
        description="Serve MODEL over the OpenAI API: /v1/models, /v1/completions, "
        "/v1/chat/completions, /health, /metrics.",
    )
    add_engine_arguments(parser, server=True)
    parser.set_defaults(func=run_serve)


def run_serve(args) -> int:
    try:
        settings = settings_from_args(args)
        api_key = resolve_api_key(settings.api_key, settings.api_key_file)
        engine, resolved = start_engine(settings)
    except (
        ValueError
    ) as err:  # a bad setting or key file, no such model, a bad checkpoint, a cache that holds nothing, ...
        print(f"latentkv serve: {err}", file=sys.stderr)
        return 2
    name = settings.served_model_name or resolved.name
    state = build_state(
        engine,
        name,
        settings.max_waiting_requests,
        api_key,
        settings.max_request_bytes,
        settings.metrics_public,
        settings.shutdown_timeout,
    )
    log(
        f"latentkv: serving {name!r} on http://{settings.host}:{settings.port}/v1"
        + (" (API key required)" if api_key else "")
    )
    # the model, engine and app live as long as the process: out of the collector's sight, the
    # collections that requests' allocations trigger walk only the requests' own objects
    gc.collect()
    gc.freeze()
    # SIGTERM / SIGINT drain (server/shutdown.py); by then the requests are ended, so uvicorn's own wait
    # for connections is short: bounded all the same
    config = uvicorn.Config(
        build_app(state),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=ENDING_GRACE,
    )
    try:
        DrainingServer(config, state.drain, state.engine).run()
    finally:
        engine.close(settings.shutdown_timeout)  # done by the app's lifespan already, unless start-up failed
    return 0
