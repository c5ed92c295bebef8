"""CPU facts: dtype "auto" follows the CPU's bf16 support; threads default to all cores."""

import os

import pytest
import torch

from latentkv import cpu
from latentkv.engine.args import EngineArgs
from latentkv.model.loader import resolve_dtype

AVX2_ONLY = {flag: flag in ("avx2", "fma3") for flag in cpu.FLAGS}


@pytest.mark.parametrize(
    "flags,expected",
    [
        (AVX2_ONLY, torch.float32),
        (AVX2_ONLY | {"avx512_f": True, "avx512_bf16": True}, torch.bfloat16),
        (AVX2_ONLY | {"amx_bf16": True}, torch.bfloat16),
    ],
)
def test_auto_dtype_is_bf16_only_where_the_cpu_computes_it(monkeypatch, flags, expected):
    monkeypatch.setattr(cpu, "features", lambda: flags)
    assert resolve_dtype("auto", torch.device("cpu")) is expected
    assert resolve_dtype("float32", torch.device("cpu")) is torch.float32  # an explicit choice stays


def test_describe_names_present_and_missing_flags(monkeypatch):
    monkeypatch.setattr(cpu, "features", lambda: AVX2_ONLY)
    assert cpu.describe().startswith("avx2 fma3 (no avx512_f")


def test_threads_default_to_all_cores_unless_set(monkeypatch):
    monkeypatch.delenv("LATENTKV_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu.default_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert cpu.default_threads() == 5
    monkeypatch.setenv("LATENTKV_THREADS", "3")
    assert cpu.default_threads() == 3
    monkeypatch.setenv("LATENTKV_THREADS", "many")
    with pytest.raises(ValueError, match="LATENTKV_THREADS='many'"):
        cpu.default_threads()


def test_engine_threads_and_backend_options_are_checked():
    assert EngineArgs("m", threads=4, attention_backend="torch").threads == 4
    with pytest.raises(ValueError, match="threads = 0 is not valid"):
        EngineArgs("m", threads=0)
    with pytest.raises(ValueError, match="attention_backend = 'cuda' is not valid; allowed: one of"):
        EngineArgs("m", attention_backend="cuda")
