"""`latentkv bench soak --minutes N`: mixed load at a fixed concurrency against `latentkv serve` (one
process, or two on one KV store directory), then what a long run must not show: 5xx answers, errors
by kind, resident memory and cache blocks over time, and blocks still held when all is idle.

The load (a weighted draw per request, `KINDS`): greedy completions from a fixed pool of prompts (a
prompt answered twice must get the same text, whichever server, batch or cache path answered it),
sampled completions, streamed chats (greedy and sampled), guided output (a JSON schema or a regex),
streams cut after a few events, prompts on a few long shared prefixes (prefix-cache and store hits)
and requests with bad parameters (a 4xx expected). With `--servers 2` the requests alternate
between two processes on one `--kv-store`, whose size bound is small enough to evict under load.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from latentkv.plots import new_figure, save_figure
from latentkv.bench.servers import PeerFailed, Running, Server, free_port, scrape, serve_command

MODEL = "soak"
KINDS = {"greedy": 4, "sampled": 2, "stream": 3, "guided": 1, "cut": 2, "prefix": 3, "bad": 1}
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wise owls count stars above "
    "an old stone bridge near the river where children sing héllo wörld café 日本語"
).split()
BAD = [  # (path, body): each must get a 4xx, never a 5xx
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}),
    ("/v1/completions", {"prompt": "hi", "temperature": -2}),
    ("/v1/completions", {"prompt": [10**12], "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "top_p": 0, "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "logprobs": 10**6}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "guided_regex": "("}),
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WARM_UP = 0.2  # of the run: RSS growth is measured from the first sample after it


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Load:
    """What the requests draw from: the greedy pools of (prompt, max_tokens), short prompts and prompts
    on the shared prefixes, and the prefixes."""

    greedy: list[tuple[str, int]]
    on_prefixes: list[tuple[str, int]]
    prefixes: list[str]
    answers: dict = field(default_factory=dict)  # greedy prompt -> the first text answered

    @classmethod
    def make(cls, seed: int, prefix_words: int) -> "Load":
        rng = random.Random(seed)
        prefixes = [words(rng, prefix_words) for _ in range(4)]
        greedy = [(words(rng, rng.randint(3, 40)), rng.randint(4, 24)) for _ in range(48)]
        on_prefixes = [
            (p + " " + words(rng, rng.randint(1, 8)), rng.randint(4, 16)) for p in prefixes for _ in range(4)
        ]
        return cls(greedy, on_prefixes, prefixes)


def greedy_check(load: Load, key, text: str) -> str:
    first = load.answers.setdefault(key, text)
    return "ok" if text == first else "greedy mismatch"


async def stream_events(client: httpx.AsyncClient, path: str, body: dict, keep: int | None = None) -> tuple[str, str]:
    """-> (outcome, text): a streamed request read to [DONE] (or cut after `keep` events)."""
    text, seen = [], 0
    async with client.stream("POST", path, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return str(response.status_code), ""
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return f"error event {event['error'].get('code')}", ""
            seen += 1
            choice = event["choices"][0] if event.get("choices") else {}
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            if keep is not None and seen >= keep:
                return "cut", ""  # leaving the block closes the connection mid-answer
    return "ok", "".join(text)


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random, load: Load) -> str:
    """Send one request of `kind`; -> its outcome ("ok", "cut", "4xx", or what went wrong)."""
    if kind in ("greedy", "prefix"):
        prompt, olen = rng.choice(load.on_prefixes if kind == "prefix" else load.greedy)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": olen, "temperature": 0}
        r = await client.post("/v1/completions", json=body)
        return (
            greedy_check(load, prompt, r.json()["choices"][0]["text"]) if r.status_code == 200 else str(r.status_code)
        )
    if kind == "sampled":
        prompt = rng.choice(load.prefixes) + " " + words(rng, 5) if rng.random() < 0.5 else words(rng, 12)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 32), "temperature": 0.8, "top_p": 0.9}
        if rng.random() < 0.5:
            body["seed"] = rng.randrange(2**31)
        r = await client.post("/v1/completions", json=body)
        return "ok" if r.status_code == 200 else str(r.status_code)
    if kind in ("stream", "cut"):
        greedy = rng.random() < 0.5
        content = words(rng, rng.randint(3, 30))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": rng.randint(8, 32),
            **({"temperature": 0} if greedy else {"temperature": 0.7, "top_p": 0.9}),
        }
        if kind == "cut":
            return (await stream_events(client, "/v1/chat/completions", body, keep=rng.randint(1, 4)))[0]
        outcome, text = await stream_events(client, "/v1/chat/completions", body)
        return (
            greedy_check(load, ("chat", content, body["max_tokens"]), text) if greedy and outcome == "ok" else outcome
        )
    if kind == "guided":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "a person as JSON"}], "max_tokens": 48}
        if rng.random() < 0.5:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        else:
            body["guided_regex"] = "(yes|no), [0-9]{1,3}"
        r = await client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return str(r.status_code)
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        if choice["finish_reason"] != "stop":
            return "ok"  # cut by max_tokens: a prefix of a match, nothing to check
        if "response_format" in body:
            try:
                value = json.loads(text)
            except ValueError:
                return "guided output off its grammar"
            return "ok" if set(value) == {"name", "age"} else "guided output off its grammar"
        return "ok" if re.fullmatch("(yes|no), [0-9]{1,3}", text) else "guided output off its grammar"
    path, body = rng.choice(BAD)
    r = await client.post(path, json={"model": MODEL, **body})
    return "4xx" if 400 <= r.status_code < 500 else str(r.status_code)


def server_5xx(metrics: dict[str, float]) -> int:
    return int(sum(v for k, v in metrics.items() if k.startswith('latentkv_requests_total{status="5')))


def sample(servers: list[Running], started: float, outcomes: Counter) -> dict:
    """One row of the time series: per server its RSS (MiB), blocks in use, running and waiting."""
    row = {"t": round(time.monotonic() - started, 1), "requests": sum(outcomes.values())}
    for i, s in enumerate(servers):
        m = scrape(s.url)
        row[f"rss_mib.{i}"] = round(psutil.Process(s.proc.pid).memory_info().rss / 2**20, 1)
        row[f"blocks.{i}"] = int(m["latentkv_cache_blocks_used"])
        row[f"running.{i}"] = int(m["latentkv_num_requests_running"])
        row[f"waiting.{i}"] = int(m["latentkv_num_requests_waiting"])
        row[f"5xx.{i}"] = server_5xx(m)
    return row


async def drive(servers: list[Running], seconds: float, concurrency: int, seed: int, load: Load, every: float):
    """`concurrency` clients, each sending one request after another for `seconds` (to the servers in
    turn); a sample every `every` s. -> (outcomes by (kind, outcome), the samples)."""
    outcomes: Counter = Counter()
    samples: list[dict] = []
    started = time.monotonic()
    end = started + seconds
    kinds, weights = list(KINDS), list(KINDS.values())
    clients = [httpx.AsyncClient(base_url=s.url, timeout=300) for s in servers]

    async def client(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        sent = 0
        while time.monotonic() < end:
            kind = rng.choices(kinds, weights)[0]
            sent += 1
            try:
                outcome = await one(clients[(n + sent) % len(clients)], kind, rng, load)
            except (httpx.HTTPError, ValueError, KeyError) as err:
                outcome = f"client error {type(err).__name__}"
            outcomes[(kind, outcome)] += 1

    async def watch() -> None:
        while time.monotonic() < end:
            try:
                samples.append(await asyncio.to_thread(sample, servers, started, outcomes))
            except httpx.HTTPError as err:  # a /metrics page not served in time: an error of the run, not its end
                outcomes[("metrics", f"client error {type(err).__name__}")] += 1
            else:
                print(f"latentkv bench soak: {format_row(samples[-1], len(servers))}", file=sys.stderr, flush=True)
            await asyncio.sleep(every)

    try:
        await asyncio.gather(watch(), *(client(n) for n in range(concurrency)))
    finally:
        for c in clients:
            await c.aclose()
    return outcomes, samples


def format_row(row: dict, n: int) -> str:
    per = [
        f"[{i}] rss {row[f'rss_mib.{i}']:.0f} MiB, blocks {row[f'blocks.{i}']}, "
        f"running {row[f'running.{i}']}, waiting {row[f'waiting.{i}']}, 5xx {row[f'5xx.{i}']}"
        for i in range(n)
    ]
    return f"{row['t']:7.1f} s  {row['requests']:6d} requests  " + "  ".join(per)


def wait_idle(url: str, timeout_s: float = 120.0) -> dict[str, float]:
    """The server's metrics once nothing runs or waits (aborts land asynchronously), or at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        idle = not m["latentkv_num_requests_running"] and not m["latentkv_num_requests_waiting"]
        if (idle and not m["latentkv_cache_blocks_used"]) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def start(args, store: Path, out: Path) -> list[Running]:
    """args.servers `latentkv serve` processes of args.model on one store, each on a free port, ready."""
    flags = [
        "--served-model-name",
        MODEL,
        "--kv-cache-memory",
        args.kv_cache_memory,
        "--max-model-len",
        str(args.max_model_len),
        "--kv-store",
        str(store),
        "--kv-store-max-size",
        args.kv_store_max_size,
        *args.serve_flag,
    ]
    running: list[Running] = []
    try:
        for i in range(args.servers):
            port = free_port()
            server = Server(f"latentkv serve [{i}]", serve_command(args.model, port, flags))
            running.append(Running(server, port, out / f"soak-server{i}.log", args.threads))
    except PeerFailed:
        for r in running:
            r.stop()
        raise
    return running


def summarize(outcomes: Counter, samples: list[dict], ends: list[dict], exits: list[int | None], n: int) -> dict:
    """The run's figures (soak.json): `ends` are each server's metrics once idle, `exits` their exit statuses."""
    after = [s for s in samples if s["t"] >= WARM_UP * samples[-1]["t"]] or samples
    growth = {i: (samples[-1][f"rss_mib.{i}"] - after[0][f"rss_mib.{i}"]) / after[0][f"rss_mib.{i}"] for i in range(n)}
    client_5xx = sum(c for (_, o), c in outcomes.items() if o.startswith("5") or "error event" in o)
    errors = {f"{k} {o}": c for (k, o), c in sorted(outcomes.items()) if o not in ("ok", "cut", "4xx")}
    return {
        "requests": sum(outcomes.values()),
        "outcomes": {f"{k} {o}": c for (k, o), c in sorted(outcomes.items())},
        "errors_by_kind": errors,
        "client_5xx": client_5xx,
        "server_5xx": sum(server_5xx(m) for m in ends),
        "leaked_blocks": [int(m["latentkv_cache_blocks_used"]) for m in ends],
        "store": [
            {k.removeprefix("latentkv_store_").removesuffix("_total"): int(v) for k, v in m.items() if "_store_" in k}
            for m in ends
        ],
        "rss_growth_after_warm_up": [round(growth[i], 4) for i in range(n)],
        "exit_codes": exits,
        "samples": samples,
    }


def passed(result: dict) -> bool:
    return (
        not result["client_5xx"]
        and not result["server_5xx"]
        and not result["errors_by_kind"]
        and not any(result["leaked_blocks"])
        and all(code == 0 for code in result["exit_codes"])
    )


def show(result: dict, n: int) -> None:
    print(f"\nlatentkv bench soak: {result['minutes']} min, {result['concurrency']} concurrent, {n} server(s)")
    print(f"{'t (s)':>7}  {'requests':>8}  " + "  ".join(f"{'RSS MiB':>8} {'blocks':>6} [{i}]" for i in range(n)))
    for s in result["samples"]:
        cells = "  ".join(f"{s[f'rss_mib.{i}']:8.0f} {s[f'blocks.{i}']:6d}    " for i in range(n))
        print(f"{s['t']:7.1f}  {s['requests']:8d}  {cells}")
    print(f"\n{'request kind':12}  outcome: count")
    for key, count in result["outcomes"].items():
        print(f"  {key}: {count}")
    print(
        f"\n5xx: {result['client_5xx']} seen by clients, {result['server_5xx']} counted by the servers; "
        f"errors by kind: {result['errors_by_kind'] or 'none'}"
    )
    print(
        f"leaked blocks at the end: {result['leaked_blocks']}; RSS growth after warm-up: "
        + ", ".join(f"{g * 100:+.1f}%" for g in result["rss_growth_after_warm_up"])
        + f"; exit codes after SIGTERM: {result['exit_codes']}"
    )
    for i, store in enumerate(result["store"]):
        print(f"KV store [{i}]: {store}")
    print("PASS" if passed(result) else "FAIL")


def plot(result: dict, n: int, out: Path) -> Path:
    fig, ax = new_figure(
        f"latentkv bench soak: {result['concurrency']} concurrent, {n} server(s)", "seconds", "server RSS (MiB)"
    )
    t = [s["t"] for s in result["samples"]]
    blocks = ax.twinx()
    blocks.set_ylabel("cache blocks in use")
    for i in range(n):
        ax.plot(t, [s[f"rss_mib.{i}"] for s in result["samples"]], label=f"RSS [{i}]")
        blocks.plot(t, [s[f"blocks.{i}"] for s in result["samples"]], "--", alpha=0.6, label=f"blocks [{i}]")
    return save_figure(fig, out, "soak")


def run(args) -> dict:
    """Start the server(s), drive the load for args.minutes, stop them (SIGTERM), report."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(args.kv_store) if args.kv_store else Path(tempfile.mkdtemp(prefix="latentkv-soak-store-"))
    servers = start(args, store, out)
    try:
        load = Load.make(args.seed, args.prefix_words)
        outcomes, samples = asyncio.run(
            drive(servers, args.minutes * 60, args.concurrency, args.seed, load, args.sample_every)
        )
        ends = [wait_idle(s.url) for s in servers]
    finally:
        for s in servers:
            s.stop()
    exits = [s.proc.returncode for s in servers]
    result = {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "servers": args.servers,
        "store_dir": str(store),
    }
    result |= summarize(outcomes, samples, ends, exits, args.servers)
    show(result, args.servers)
    (out / "soak.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(f"latentkv bench soak: wrote {out / 'soak.json'} and {plot(result, args.servers, out)}")
    return result
