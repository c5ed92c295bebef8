"""`latentkv serve [MODEL]`: the OpenAI-compatible HTTP server."""
from __future__ import annotations

import sys

from latentkv.server.guard import API_KEY_ENV, DEFAULT_MAX_REQUEST_BYTES, resolve_api_key
from latentkv.settings import SettingsError, add_engine_arguments, settings_from_args

SERVER_FLAGS = ("host", "port", "api_key", "served_model_name", "max_waiting_requests")


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over the OpenAI API (HTTP)",
                                   description="Serve MODEL over the OpenAI API: /v1/models, /v1/completions, "
                                               "/v1/chat/completions, /health, /metrics.")
    add_engine_arguments(parser)
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8000)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on every route but /health (visible in `ps`: "
                             f"prefer --api-key-file or ${API_KEY_ENV})")
    parser.add_argument("--api-key-file", default=None, metavar="FILE", help="read the API key from FILE")
    parser.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"refuse larger request bodies with 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    parser.add_argument("--served-model-name", default=None, help="the model name clients send (default: the model's)")
    parser.add_argument("--max-waiting-requests", type=int, default=None,
                        help="answer 503 + Retry-After when more sequences than this would wait (default 256)")
    parser.set_defaults(func=run_serve)


def run_serve(args) -> int:
    try:
        settings = settings_from_args(args, SERVER_FLAGS)
        api_key = resolve_api_key(settings.api_key, args.api_key_file)
    except (SettingsError, ValueError) as err:
        print(f"latentkv serve: {err}", file=sys.stderr)
        return 2
    if args.max_request_bytes < 1:
        print("latentkv serve: --max-request-bytes must be positive", file=sys.stderr)
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
    state = build_state(engine, name, settings.max_waiting_requests, api_key, args.max_request_bytes,
                        args.metrics_public)
    log(f"latentkv: serving {name!r} on http://{settings.host}:{settings.port}/v1"
        + (" (API key required)" if api_key else ""))
    uvicorn.run(build_app(state), host=settings.host, port=settings.port, log_level="warning")
    return 0
