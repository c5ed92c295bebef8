"""The bundled SmolLM2 converted at a quarter of its f16 KV cache into the transform-coded format
(`convert --kv-bytes 5760`) and served end to end by `latentkv generate`: the folder's format, its bytes a
token, the reference backend, and the same answer as the library gives."""

from __future__ import annotations

import pytest

from latentkv import LLM, SamplingParams
from latentkv.cache.transform_code import folder_code
from latentkv.cli import main
from latentkv.config import ModelConfig

pytestmark = pytest.mark.slow  # the real bundled model, converted (minutes)

PROMPT = "What is the capital of France?"


def test_a_kv_bytes_folder_is_served_by_generate(tmp_path, capsys):
    out = tmp_path / "kv5760"
    convert = ["convert", "--kv-bytes", "5760", "--kv-formats", "transform_code", "--kv-rope-dims", "all"]
    assert main([*convert, "--eval-tokens", "0", "--out", str(out)]) == 0
    code = folder_code(ModelConfig.from_file(out / "config.json"))
    assert code is not None and code.bytes_per_token() <= 5760
    capsys.readouterr()
    flags = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-tokens", "12", "--temperature", "0"]
    assert main(["generate", str(out), "--prompt", PROMPT, "--chat", *flags]) == 0
    printed = capsys.readouterr()
    assert f"{code.bytes_per_token()} bytes/token, transform_code" in printed.err
    assert "attention native coded" in printed.err and "decode native coded kernel" in printed.err
    assert "decode plan on" in printed.err
    llm = LLM(str(out), dtype="float32", kv_cache_memory="32MiB")
    params = SamplingParams(temperature=0, max_tokens=12)
    answer = llm.chat([{"role": "user", "content": PROMPT}], params, use_tqdm=False)[0].outputs[0].text
    assert answer.strip() and answer.strip() in printed.out
