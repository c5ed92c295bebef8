"""`latentkv bench soak` (minutes of mixed load) and `latentkv bench shutdown` (SIGTERM under load, then a
restart on the KV store) against started `latentkv serve` processes; neither is part of `make test`."""

from __future__ import annotations

from latentkv.bench import shutdown, soak
from latentkv.bench.models import default_models
from latentkv.bench.servers import PeerFailed


def register(sub) -> None:
    p = sub.add_parser(
        "soak",
        help="minutes of mixed load at 32 concurrent against latentkv serve: 5xx, errors, RSS and blocks over time",
        description=soak.__doc__.split("\n\n")[0],
    )
    p.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    p.add_argument("--concurrency", type=int, default=32, help="clients sending at once (default 32)")
    p.add_argument(
        "--servers", type=int, choices=(1, 2), default=1, help="server processes, on one KV store (default 1)"
    )
    p.add_argument("--model", help="an MLA folder (default: the bundled SmolLM2, converted and cached)")
    p.add_argument("--kv-store", help="the KV store directory the servers share (default: a new temporary one)")
    p.add_argument(
        "--kv-store-max-size", default="64MiB", help="its bound, small so that it evicts under load (default 64MiB)"
    )
    p.add_argument("--kv-cache-memory", default="256MiB", help="each server's latent cache (default 256MiB)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prefix-words", type=int, default=200, help="words in each shared prefix (default 200)")
    p.add_argument("--threads", type=int, default=2, help="cores each server may run on (default 2)")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="another flag for latentkv serve, e.g. --serve-flag=--dtype=bfloat16 (repeatable)",
    )
    p.add_argument("--out", default="bench-results", help="folder for soak.json, soak.png and the servers' logs")
    p.set_defaults(func=run_soak)

    p = sub.add_parser(
        "shutdown",
        help="SIGTERM under load at a long prompt's first token, then a restart on the KV store: TTFT, text, blocks",
        description=shutdown.__doc__.split("\n\n")[0],
    )
    p.add_argument("--rounds", type=int, default=3, help="SIGTERM-and-restart rounds, each a new prompt (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=4096, help="about how long the prompt is (default 4096)")
    p.add_argument("--in-flight", type=int, default=8, help="clients sending short requests beside it (default 8)")
    p.add_argument("--busy", type=int, default=2, help="busy loops beside the server (default 2: both cores busy)")
    p.add_argument("--model", help="an MLA folder (default: the bundled SmolLM2, converted and cached)")
    p.add_argument("--kv-store", help="the KV store directory (default: a new temporary one)")
    p.add_argument("--kv-cache-memory", default="512MiB", help="the server's latent cache (default 512MiB)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2, help="cores the server may run on (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-flag", action="append", default=[], metavar="FLAG", help="another flag for latentkv serve")
    p.add_argument("--out", default="bench-results", help="folder for shutdown.json, shutdown.png and the logs")
    p.set_defaults(func=run_shutdown)


def run_soak(args) -> int:
    if args.minutes <= 0 or args.concurrency < 1:
        raise SystemExit("--minutes and --concurrency must be positive")
    return run_and_judge("soak", soak, args)


def run_shutdown(args) -> int:
    if args.rounds < 1 or args.prompt_tokens < 1 or args.in_flight < 0 or args.busy < 0:
        raise SystemExit("--rounds and --prompt-tokens must be positive, --in-flight and --busy not negative")
    return run_and_judge("shutdown", shutdown, args)


def run_and_judge(name: str, bench, args) -> int:
    """`bench.run(args)` (soak or shutdown; the bundled model where --model is absent), then the exit code:
    0 where `bench.passed` its result, 1 where not or where a server failed (its reason printed)."""
    if args.model is None:
        args.model = default_models(need_stock=False)[0]
    try:
        result = bench.run(args)
    except PeerFailed as err:
        print(f"latentkv bench {name}: {err.reason}")
        return 1
    return 0 if bench.passed(result) else 1
