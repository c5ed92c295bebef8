"""`latentkv bench shutdown`: what a SIGTERM under load keeps, measured on started `latentkv serve` processes.

A server on `--kv-store DIR` answers a long prompt (~`--prompt-tokens`, streamed, 2 tokens asked) while
`--in-flight` clients keep short requests running beside it (streamed and not, greedy and sampled) and
`--busy` loops of pure Python keep the cores busy. SIGTERM goes to the server the moment the long
prompt's first token arrives. Then: the server's exit status, the outcome of every request (completed,
or ended with an error in OpenAI's format, the drain's 503 among them; one sent after the signal may also
find the port closed), and what the store kept: a new server on the same DIR answers the same prompt — its TTFT
against the cold one (the signalled server's, which prefilled the prompt from nothing), its text
against the text answered before the signal, the blocks it read back against the prompt's full blocks.
Each round uses a new prompt; a round's restarted server is the next round's signalled one.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from latentkv.bench.servers import PeerFailed, Running, Server, free_port, serve_command
from latentkv.bench.soak import words
from latentkv.plots import new_figure, save_figure
from latentkv.settings import Settings

MODEL = "shutdown"
WORDS_PER_TOKEN = 0.8  # the soak's words are ~1.25 tokens each in SmolLM2's tokenizer (the count is reported)
STORE_LINE = re.compile(r"KV store: (\d+) queued block\(s\) written, (\d+) dropped")


def busy_loops(n: int) -> list[subprocess.Popen]:
    """`n` processes spinning in pure Python: the cores a compile or another job would take."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def well_formed(error: object) -> bool:
    """An error in OpenAI's shape, with a code."""
    return isinstance(error, dict) and all(isinstance(error.get(k), str) and error[k] for k in ("message", "code"))


async def streamed(client: httpx.AsyncClient, body: dict, on_first=None) -> dict:
    """A streamed completion read to its end: {"outcome", "text", "ttft", "prompt_tokens"}; `on_first()` is
    called as the first token arrives. Outcomes: "completed", "error <code>" (a well-formed error event then
    [DONE]), "<status>", or what was wrong with the stream."""
    start, text, ttft, usage, ended = time.perf_counter(), [], None, {}, None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return {"outcome": refusal(response.status_code, await response.aread(), response.headers)}
        lines = response.aiter_lines()
        while True:
            try:
                line = await anext(lines)
            except StopAsyncIteration:
                break
            except httpx.HTTPError as err:
                ended = f"stream cut ({type(err).__name__})"
                break
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                ended = ended or "completed"
                break
            try:
                event = json.loads(line[6:])
            except ValueError:
                ended = "malformed event"
                break
            if "error" in event:
                ended = (
                    f"error {event['error'].get('code')}" if well_formed(event["error"]) else "malformed error event"
                )
                continue
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                if choice.get("text"):
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    if on_first is not None and len(text) == 0:
                        on_first()
                    text.append(choice["text"])
    return {
        "outcome": ended or "stream ended without [DONE]",
        "text": "".join(text),
        "ttft": ttft,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
    }


def refusal(status: int, raw: bytes, headers) -> str:
    """A non-200 answer: "503 refused" when it is the shutdown's well-formed 503 with Retry-After."""
    try:
        error = json.loads(raw).get("error")
    except ValueError:
        error = None
    if status == 503 and well_formed(error) and "retry-after" in headers:
        return "503 refused"
    return f"{status} {'well-formed' if well_formed(error) else 'malformed'}"


async def side_client(url: str, n: int, stop: asyncio.Event, signalled: asyncio.Event, outcomes: list) -> None:
    """One client sending short requests one after another until `stop`: each outcome is recorded with
    whether it was sent after the signal."""
    rng = random.Random(n)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while not stop.is_set():
            after = signalled.is_set()
            body = {"model": MODEL, "prompt": words(rng, rng.randint(2, 6)), "max_tokens": rng.randint(16, 64)}
            body |= {"temperature": 0} if rng.random() < 0.5 else {"temperature": 1.0}
            try:
                if rng.random() < 0.5:
                    outcome = (await streamed(client, body))["outcome"]
                else:
                    r = await client.post("/v1/completions", json=body)
                    outcome = "completed" if r.status_code == 200 else refusal(r.status_code, r.content, r.headers)
            except httpx.ConnectError:
                outcome = "port closed"
                await asyncio.sleep(0.05)
            except httpx.HTTPError as err:
                outcome = f"no answer ({type(err).__name__})"
            outcomes.append((after, outcome))
            if outcome == "503 refused":
                await asyncio.sleep(1.0)  # as a client honouring the 503's Retry-After (1 s) does


def acceptable(after: bool, outcome: str) -> bool:
    """A request completes or ends with a well-formed error: an error event, or the drain's 503 with
    Retry-After (also for one sent just before the signal that the server had not taken in yet). One sent
    after the signal may also find the port closed, or lose its connection before any answer as the
    server closes it (what any HTTP server's exit does to a request it has not read)."""
    if outcome in ("completed", "503 refused") or (outcome.startswith("error ") and outcome != "error None"):
        return True
    return after and (outcome == "port closed" or outcome.startswith("no answer"))


async def round_trip(server: Running, prompt: str, in_flight: int, signal_it: bool) -> tuple[dict, list]:
    """The long prompt on `server` with `in_flight` side clients running; SIGTERM at its first token when
    `signal_it`, then the side clients go on until the server has exited. -> (its result, side outcomes)."""
    stop, signalled, outcomes = asyncio.Event(), asyncio.Event(), []
    sides = [asyncio.create_task(side_client(server.url, n, stop, signalled, outcomes)) for n in range(in_flight)]
    await asyncio.sleep(1.0)  # let the side requests be running when the long one comes

    def first_token() -> None:
        if signal_it:
            os.kill(server.proc.pid, signal.SIGTERM)
            signalled.set()

    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        long = await streamed(client, body, on_first=first_token)
    if signal_it:
        try:
            await asyncio.to_thread(server.proc.wait, 120)
        except subprocess.TimeoutExpired:
            outcomes.append((True, "server still running 120 s after SIGTERM"))
    stop.set()
    await asyncio.gather(*sides)
    return long, outcomes


def start(model: str, store: Path, args, log: Path) -> Running:
    flags = ["--served-model-name", MODEL, "--kv-store", str(store), "--kv-cache-memory", args.kv_cache_memory]
    flags += ["--max-model-len", str(args.max_model_len), *args.serve_flag]
    port = free_port()
    server = Running(Server("latentkv serve", serve_command(model, port, flags)), port, log, args.threads)
    httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}, timeout=300)
    return server


def store_report(log: Path) -> tuple[int, int] | None:
    """(blocks written, dropped) at the shutdown, from the server's log."""
    found = STORE_LINE.findall(log.read_text(errors="replace"))
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def full_blocks(prompt_tokens: int | None) -> int:
    """The prompt's blocks a prefix lookup can serve: full ones before its last token (which is computed)."""
    return max(0, (prompt_tokens or 0) - 1) // Settings().block_size


def run(args) -> dict:
    """args.rounds of: the long prompt on a server, SIGTERM at its first token, the same prompt on a
    server restarted on the same store."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(args.kv_store) if args.kv_store else Path(tempfile.mkdtemp(prefix="latentkv-shutdown-store-"))
    rng = random.Random(args.seed)
    loops = busy_loops(args.busy)
    rounds, logs = [], [out / "server0.log"]
    server = start(args.model, store, args, logs[0])
    try:
        for r in range(args.rounds):
            prompt = words(rng, int(args.prompt_tokens * WORDS_PER_TOKEN))
            print(f"latentkv bench shutdown: round {r + 1}/{args.rounds}: SIGTERM at the first token", file=sys.stderr)
            cold, before = asyncio.run(round_trip(server, prompt, args.in_flight, signal_it=True))
            if cold.get("ttft") is None:
                raise PeerFailed(f"the long prompt got no token: {cold['outcome']} (is --max-model-len long enough?)")
            exit_code, written = server.proc.returncode, store_report(logs[-1])
            server.stop()
            logs.append(out / f"server{len(logs)}.log")
            print(f"latentkv bench shutdown: round {r + 1}: restarted on the store", file=sys.stderr)
            server = start(args.model, store, args, logs[-1])
            warm, after = asyncio.run(round_trip(server, prompt, args.in_flight, signal_it=False))
            rounds.append(
                {
                    "prompt_tokens": cold.get("prompt_tokens"),
                    "full_blocks": full_blocks(cold.get("prompt_tokens")),
                    "cold": cold,
                    "restored": warm,
                    "blocks_read_back": (warm.get("cached_tokens") or 0) // Settings().block_size,
                    "store_written_dropped": written,
                    "exit_code": exit_code,
                    "in_flight": summarize_outcomes(before),
                    "bad": [o for a, o in before + after if not acceptable(a, o)],
                }
            )
            print(f"latentkv bench shutdown: {format_round(rounds[-1])}", file=sys.stderr)
    finally:
        server.stop()
        for loop in loops:
            loop.kill()
            loop.wait()
    result = {
        "rounds": rounds,
        "busy_loops": args.busy,
        "in_flight_clients": args.in_flight,
        "last_exit_code": server.proc.returncode,
        "store_dir": str(store),
    }
    ratios = [x["cold"]["ttft"] / x["restored"]["ttft"] for x in rounds if x["restored"].get("ttft")]
    result["median_ttft_ratio"] = statistics.median(ratios) if ratios else None
    show(result)
    (out / "shutdown.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(f"latentkv bench shutdown: wrote {out / 'shutdown.json'} and {plot(result, out)}")
    return result


def summarize_outcomes(outcomes: list) -> dict:
    counts: dict[str, int] = {}
    for after, outcome in outcomes:
        key = f"{'after' if after else 'before'} the signal: {outcome}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def same_text(x: dict) -> bool:
    return x["cold"].get("text") is not None and x["cold"].get("text") == x["restored"].get("text")


def format_round(x: dict) -> str:
    cold, warm = x["cold"].get("ttft"), x["restored"].get("ttft")
    ratio = f"{cold / warm:.1f}x" if cold and warm else "-"
    return (
        f"{x['prompt_tokens']} prompt tokens ({x['full_blocks']} full blocks); TTFT cold {cold or float('nan'):.2f} s, "
        f"after the restart {warm or float('nan'):.2f} s ({ratio}); blocks read back {x['blocks_read_back']}; "
        f"same text: {same_text(x)}; exit {x['exit_code']}"
    )


def passed(result: dict) -> bool:
    return result["last_exit_code"] == 0 and all(
        x["exit_code"] == 0
        and not x["bad"]
        and same_text(x)
        and x["cold"]["outcome"] == x["restored"]["outcome"] == "completed"
        and x["blocks_read_back"] == x["full_blocks"]
        for x in result["rounds"]
    )


def show(result: dict) -> None:
    print(
        f"\nlatentkv bench shutdown: {len(result['rounds'])} round(s), "
        f"{result['in_flight_clients']} clients in flight, {result['busy_loops']} busy loop(s) beside the server"
    )
    print(
        "| round | prompt tokens | TTFT cold (s) | TTFT after restart (s) | cold / restored | blocks read back "
        "| written / dropped at shutdown | same text | exit |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for i, x in enumerate(result["rounds"], 1):
        cold, warm = x["cold"].get("ttft"), x["restored"].get("ttft")
        written = "/".join(map(str, x["store_written_dropped"])) if x["store_written_dropped"] else "not logged"
        print(
            f"| {i} | {x['prompt_tokens']} | {cold:.2f} | {warm:.2f} | {cold / warm:.1f}x | "
            f"{x['blocks_read_back']} of {x['full_blocks']} | {written} | {same_text(x)} | {x['exit_code']} |"
            if cold and warm
            else f"| {i} | {x['prompt_tokens']} | - | - | - | {x['blocks_read_back']} | {written} | {same_text(x)} "
            f"| {x['exit_code']} |"
        )
    for i, x in enumerate(result["rounds"], 1):
        print(f"round {i}, requests beside the long one: {x['in_flight']}")
        if x["bad"]:
            print(f"round {i}: NOT well-formed: {x['bad']}")
    if result["median_ttft_ratio"]:
        print(f"median cold / restored TTFT: {result['median_ttft_ratio']:.1f}x")
    print("PASS" if passed(result) else "FAIL")


def plot(result: dict, out: Path) -> Path:
    fig, ax = new_figure("TTFT of a long prompt: cold vs after a SIGTERM and restart", "round", "TTFT (s)")
    n = range(1, len(result["rounds"]) + 1)
    ax.bar([i - 0.2 for i in n], [x["cold"].get("ttft") or 0 for x in result["rounds"]], 0.4, label="cold")
    ax.bar([i + 0.2 for i in n], [x["restored"].get("ttft") or 0 for x in result["rounds"]], 0.4, label="restored")
    ax.set_xticks(list(n))
    return save_figure(fig, out, "shutdown")
