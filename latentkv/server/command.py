"""`latentkv serve [MODEL]`: the OpenAI-compatible HTTP server."""
from __future__ import annotations

import sys

from latentkv.settings import SettingsError, add_engine_arguments, settings_from_args

SERVER_FLAGS = ("host", "port", "api_key", "served_model_name", "max_waiting_requests")


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over the OpenAI API (HTTP)",
                                   description="Serve MODEL over the OpenAI API: /v1/models, /v1/completions, "
                                               "/v1/chat/completions, /health, /metrics.")
    add_engine_arguments(parser)
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8000)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    parser.add_argument("--served-model-name", default=None, help="the model name clients send (default: the model's)")
    parser.add_argument("--max-waiting-requests", type=int, default=None,
                        help="answer 503 + Retry-After when more sequences than this would wait (default 256)")
    parser.set_defaults(func=run_serve)


def run_serve(args) -> int:
    try:
        settings = settings_from_args(args, SERVER_FLAGS)
    except SettingsError as err:
        print(f"latentkv serve: {err}", file=sys.stderr)
        return 2
    import uvicorn

    from latentkv.commands.startup import log, start_engine
    from latentkv.server.app import build_app, build_state

    try:
        engine, resolved = start_engine(settings)
    except ValueError as err:  # no such model, a bad checkpoint, a cache that holds nothing, ...
        print(f"latentkv serve: {err}", file=sys.stderr)
        return 2
    name = settings.served_model_name or resolved.name
    state = build_state(engine, name, settings.max_waiting_requests, settings.api_key)
    log(f"latentkv: serving {name!r} on http://{settings.host}:{settings.port}/v1"
        + (" (API key required)" if settings.api_key else ""))
    uvicorn.run(build_app(state), host=settings.host, port=settings.port, log_level="warning")
    return 0
