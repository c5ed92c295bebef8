"""`latentkv bench soak`: minutes of mixed load against started `latentkv serve` processes (not part of
`make test`; its one-minute form is a slow test)."""

from __future__ import annotations

from latentkv.bench import soak
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


def run_soak(args) -> int:
    if args.minutes <= 0 or args.concurrency < 1:
        raise SystemExit("--minutes and --concurrency must be positive")
    if args.model is None:
        args.model = default_models(need_stock=False)[0]
    try:
        result = soak.run(args)
    except PeerFailed as err:
        print(f"latentkv bench soak: {err.reason}")
        return 1
    return 0 if soak.passed(result) else 1
