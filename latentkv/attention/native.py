"""The native CPU backend: paged MLA decode in C++/OpenMP (csrc/mla_decode.cpp).

Built with torch.utils.cpp_extension on first use into the user cache (user_cache.cache_root(),
~/.cache/latentkv by default: torch_extensions/; rebuilt when the source changes); `build_in_background`
starts that build early (a first start converts the bundled model meanwhile). Where it cannot be built or loaded (no compiler, no
ninja, another OS), `available()` is False, `get_backend("auto")` picks the PyTorch reference
and one warning says why. The instruction set is chosen at run time: the best this CPU
runs (avx512_bf16 > avx512 > avx2 > scalar), or `LATENTKV_CPU_ISA=avx512_bf16|avx512|avx2|scalar`
to force one. avx512_bf16 computes a bf16 query's dot products with vdpbf16ps (csrc/mla_decode_bf16.h);
float32 queries, and the other paths, compute in float32 FMAs (csrc/mla_decode_impl.h). The
batch-invariant prefill kernel has the same dispatch: float32 FMAs at the ISA's vector width
(csrc/mla_prefill_f32.h), bf16 dot products for bf16 on avx512_bf16 (csrc/mla_prefill_bf16.h).
`LATENTKV_NATIVE=0` makes the build "unavailable" (the fallback, on purpose).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch

from ..user_cache import cache_root
from .metadata import AttentionMetadata
from .prefill import span_prefill
from .torch_ref import QUERY_CHUNK, TorchBackend

CSRC = Path(__file__).parent / "csrc"
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3}  # avx512_bf16: bf16 dot products for bf16 queries
# The dtypes whose prompt rows the native prefill kernel takes, on every ISA (others: the SDPA
# tiles). bf16 without avx512_bf16 is widened to float32 in the kernel: one layer of the bundled
# model at 1K-4K, 1 thread, avx2, was 1.3-1.4x faster than SDPA's bf16 tiles (float32: 1.3-1.65x).
PREFILL_DTYPES = (torch.float32, torch.bfloat16)
MAX_QUERY_LEN = 16  # longer query blocks (prefill chunks) are matmul-shaped: the reference's bmm wins
_state: dict = {}
_lock = threading.Lock()  # one build per process, even when a background thread started it


def build_dir() -> Path:
    """One build folder per Python, torch and checkout: two installs of latentkv on one machine
    (a clone and a venv, two worktrees) would otherwise rebuild over each other's loaded library."""
    checkout = hashlib.sha1(str(CSRC.resolve()).encode()).hexdigest()[:8]
    return cache_root() / "torch_extensions" / (
        f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__.split('+')[0]}-{checkout}")


def extension():
    """The compiled module, or None (with the reason in `unavailable_reason()`); built once per process."""
    return lazy_build(_state, _lock, _build)


def _build(state: dict) -> None:
    state["module"], state["reason"] = None, None
    try:
        if os.environ.get("LATENTKV_NATIVE", "1") == "0":
            raise RuntimeError("disabled by LATENTKV_NATIVE=0")
        state["module"] = compile_extension("latentkv_mla_decode", CSRC / "mla_decode.cpp", build_dir())
    except Exception as err:  # no compiler, no ninja, a failed build: the reference backend takes over
        state["reason"] = failure_reason(err)


def lazy_build(state: dict, lock: threading.Lock, build) -> object:
    """state["module"] of an optional extension (None when it cannot be built; state["reason"] says
    why), built once per process by build(new_state) — the one lazy-build rule of latentkv's three
    extensions (this kernel, model/fused.py, model/qlinear.py). The first caller builds under the
    lock (a background thread may be doing it: others wait); the result is published in one
    update, so later callers — the decode step asks hundreds of times — read it without the lock."""
    if "module" in state:
        return state["module"]
    with lock:
        if "module" not in state:
            built: dict = {}
            build(built)
            state.update(built)
        return state["module"]


def build_in_background(*builders) -> list[threading.Thread]:
    """Run each extension builder (e.g. `extension`) in its own daemon thread, now: a first build is
    ~25 s of g++ per extension, which then overlaps the caller's work (and each other) instead of
    stalling the first forward pass. Later calls of a builder wait for its thread's build (its lock)."""
    threads = [threading.Thread(target=build, daemon=True, name=f"latentkv-build-{build.__module__}")
               for build in builders]
    for thread in threads:
        thread.start()
    return threads


def compile_extension(name: str, source: Path, directory: Path, extra_include: Path | None = None):
    """Build (or load the cached build of) one native extension of latentkv, with the flags they
    all share; CSRC (cpu_isa.h) is always on the include path. Raises if it cannot be built."""
    ensure_ninja()
    # Optional heavy import: cpp_extension pulls in setuptools and is only needed to build.
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    includes = [str(CSRC)] + ([str(extra_include)] if extra_include else [])
    return load(name=name, sources=[str(source)], build_directory=str(directory),
                extra_cflags=["-O3", "-fopenmp", "-ffp-contract=fast"], extra_ldflags=["-fopenmp"],
                extra_include_paths=includes, verbose=False)


def failure_reason(err: Exception) -> str:
    """One line saying why an extension is unavailable (its type and the last line of its message)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


def ensure_ninja() -> None:
    """cpp_extension runs `ninja` from PATH; the `ninja` wheel (a dependency) puts it next to python."""
    if shutil.which("ninja"):
        return
    here = Path(sys.executable).parent
    try:
        import ninja  # optional: only its binary's folder is needed

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{here}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError:
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def available() -> bool:
    return extension() is not None


def unavailable_reason() -> str | None:
    extension()
    return _state["reason"]


def supported_isas() -> list[str]:
    ext = extension()
    if ext is None:
        return []
    codes = set(ext.supported_isas())
    return [name for name, code in ISAS.items() if code in codes]


def chosen_isa() -> str:
    """The instruction set the kernel runs: LATENTKV_CPU_ISA if set (must be supported), else the best."""
    supported = supported_isas()
    forced = os.environ.get("LATENTKV_CPU_ISA")
    if forced:
        if forced not in ISAS:
            raise ValueError(f"LATENTKV_CPU_ISA={forced!r}: expected one of {list(ISAS)}")
        if forced not in supported:
            raise ValueError(f"LATENTKV_CPU_ISA={forced!r}: this CPU runs only {supported}")
        return forced
    return supported[-1]


def mla_decode(query, cache, block_tables, context_lens, query_pos=None, heads: int = 1, isa: str | None = None,
               threads: int | None = None) -> torch.Tensor:
    """query [B, M, r+dr] (M = Q*heads rows, absorbed and scaled) over one layer's LatentCache ->
    o_lat [B, M, r] in the query dtype. Rows of query token q see keys j <= query_pos[b, q]
    (None: the whole context)."""
    empty = query.new_empty(0)
    if cache.quantized:
        kv, latent, scale, rope = empty, cache.latent, cache.scale, cache.rope
    else:
        kv, latent, scale, rope = cache.kv, empty, empty, empty
    pos = query_pos if query_pos is not None else context_lens.new_empty(0)
    return extension().mla_decode(query, kv, latent, scale, rope, block_tables, context_lens, pos, heads,
                                  cache.kv_rank, cache.block_size, ISAS[isa or chosen_isa()],
                                  threads or torch.get_num_threads())


def mla_prefill(q, kv, k_r, dn: int, first: int, key_start: int, m, l, acc, scale: float,
                isa: str | None = None) -> None:
    """One span of the invariant prefill (attention/prefill.py span_prefill has the contract).
    float32 FMAs at the ISA's vector width (csrc/mla_prefill_f32.h; bf16 tensors widened), or bf16
    dot products for bf16 tensors on avx512_bf16 (csrc/mla_prefill_bf16.h)."""
    extension().mla_prefill(q, kv, k_r, dn, first, key_start, m, l, acc, scale, ISAS[isa or chosen_isa()],
                            torch.get_num_threads())


def prefill_supported(dtype: torch.dtype) -> bool:
    """Whether the native prefill kernel takes these prompt rows (else the SDPA tiles do)."""
    return dtype in PREFILL_DTYPES


class NativeBackend(TorchBackend):
    """The reference backend with its absorbed attention (paged MLA decode) in C++: no gather,
    no padding, each latent row read once for all heads; batch-invariant prompt rows by the native
    prefill kernel (span by span), float32 and bf16 on every ISA. Other prefill paths stay the
    reference's."""

    name = "native"

    def __init__(self):
        if not available():
            raise RuntimeError(f"the native attention backend is not available here ({unavailable_reason()})")
        self.isa = chosen_isa()

    def prompt_attention(self, layer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        if q_nope.device.type == "cpu" and prefill_supported(q_nope.dtype):
            return span_prefill(layer, q_nope, q_rope, cache, meta, functools.partial(mla_prefill, isa=self.isa))
        return super().prompt_attention(layer, q_nope, q_rope, cache, meta)

    def attend(self, layer, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        # Outside batch-invariant mode too, one sequence's prefill chunk (with or without cached
        # context) takes the prompt kernel: faster than SDPA's flash (bf16 on avx512_bf16 ~5x at
        # 4K, float32 on avx2 ~1.3-1.4x) and than the tiled latent path, and memory-bounded.
        if meta.path == "auto" and not meta.invariant and meta.num_seqs == 1 and meta.max_query_len > MAX_QUERY_LEN \
                and q_nope.device.type == "cpu" and prefill_supported(q_nope.dtype):
            return span_prefill(layer, q_nope, q_rope, cache, meta, functools.partial(mla_prefill, isa=self.isa))
        return super().attend(layer, q_nope, q_rope, cache, meta)

    def latent_attention(self, query, cache, meta: AttentionMetadata) -> torch.Tensor:
        if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.bfloat16) \
                or meta.max_query_len > MAX_QUERY_LEN and not meta.invariant:
            return super().latent_attention(query, cache, meta)
        heads = query.shape[1] // meta.max_query_len
        if meta.max_query_len == 1:
            return mla_decode(query, cache, meta.block_tables, meta.context_lens, None, heads, self.isa)
        # Batch-invariant: every row through the kernel (its spans sit at fixed positions), in
        # QUERY_CHUNK-token slices so its per-span buffers stay bounded; rows are independent.
        parts = [mla_decode(query[:, first * heads:(first + QUERY_CHUNK) * heads].contiguous(), cache,
                            meta.block_tables, meta.context_lens,
                            meta.query_pos[:, first:first + QUERY_CHUNK].contiguous(), heads, self.isa)
                 for first in range(0, meta.max_query_len, QUERY_CHUNK)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
