"""`latentkv convert` and `convert-sweep`'s command lines, and `latentkv convert` then `latentkv eval ppl`
end to end on the bundled model (tiny budget)."""

from __future__ import annotations

import argparse
import json

import pytest

from latentkv.cli import main
from latentkv.commands.convert import register
from latentkv.convert.options import ConvertOptions
from latentkv.sources.corpus import pydoc_documents


@pytest.mark.slow  # converts the real bundled SmolLM2 (no source given)
def test_convert_then_eval(tmp_path, capsys):
    text = tmp_path / "calib.txt"
    text.write_text("\n\n".join(t for _, t in pydoc_documents()[:6]))
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n\n".join(t for _, t in pydoc_documents()[-6:]))
    out = tmp_path / "mla"
    code = main(
        [
            "convert",
            "--out",
            str(out),
            "--rope-dim",
            "32",
            "--kv-rank",
            "96",
            "--calib",
            str(text),
            "--calib-tokens",
            "256",
            "--ctx",
            "128",
            "--eval-tokens",
            "256",
            "--dtype",
            "bfloat16",
        ]
    )
    assert code == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v3" and cfg["qk_rope_head_dim"] == 32
    assert cfg["latentkv"]["kv_lora_ranks"] == [96] * cfg["num_hidden_layers"]
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] and cfg["q_lora_rank"] is None
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    assert "chat_template" in (out / "tokenizer_config.json").read_text() or (out / "chat_template.jinja").is_file()
    card = capsys.readouterr().out
    # one model: what the converter measured is what `eval ppl` measures on the folder it wrote
    for name, model in [("source", []), ("converted", [str(out)])]:
        assert main(["eval", "ppl", *model, "--ctx", "128", "--max-tokens", "256", "--json"]) == 0
        ppl = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ppl"]
        # the same model code; the converter runs it one layer at a time over all windows at once, so
        # float32 rounding may differ in the last place (the fused ops batch rows differently)
        line = next(line for line in card.splitlines() if line.startswith(f"| {name} ppl |"))
        assert float(line.split("|")[2]) == pytest.approx(ppl, rel=1e-5, abs=1e-4), (name, ppl, line)
    results = {}
    for name, model in [("source", []), ("converted", [str(out)])]:
        assert (
            main(["eval", "ppl", *model, "--text", str(heldout), "--ctx", "64", "--max-tokens", "128", "--json"]) == 0
        )
        results[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for r in results.values():
        assert set(r) == {"ppl", "tokens", "ctx"} and r["tokens"] == 2 * 63 and r["ctx"] == 64
    # lossy (rope 32, rank 96, 256 calibration tokens) but still a language model on unseen text
    assert 0.5 < results["converted"]["ppl"] / results["source"]["ppl"] < 4


def test_convert_refuses_bad_options(tmp_path, capsys):
    assert main(["convert", "--out", str(tmp_path / "x"), "--rope-dim", "7"]) == 2
    assert "rope dim" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "y")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["convert", "--out", str(tmp_path / "z"), "--calib-weight", "0"]) == 2
    assert "calib_weight must be positive" in capsys.readouterr().err
    assert main(["convert", "--out", str(tmp_path / "w"), "--refine-steps", "-1"]) == 2
    assert "refine_steps must be 0 (off) or a positive number" in capsys.readouterr().err


def test_the_window_option_parses_and_is_checked():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["convert", "--out", "x", "--rope-window", "all"]).rope_window is None
    assert parser.parse_args(["convert", "--out", "x", "--rope-window", "32"]).rope_window == 32
    assert parser.parse_args(["convert", "--out", "x"]).rope_window == ConvertOptions().rope_window
    with pytest.raises(ValueError, match="rope_window"):
        ConvertOptions(rope_window=0).check()


def test_the_sweep_command_takes_rope_all_and_sizes():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["convert-sweep", "--rope-dims", "all", "64", "--sizes", "0.833", "0.5"])
    assert args.rope_dims == ["all", 64] and args.sizes == [0.833, 0.5] and args.ranks is None


def test_kv_bytes_takes_the_rope_dims_to_try():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["convert", "--out", "x", "--kv-bytes", "5760", "--kv-rope-dims", "all", "64"])
    assert args.kv_rope_dims == ["all", 64]
    assert parser.parse_args(["convert", "--out", "x"]).kv_rope_dims is None
    ConvertOptions(kv_bytes=5760, kv_rope_dims=("all", 64)).check()
    with pytest.raises(ValueError, match="even rope dims or 'all', got 7"):
        ConvertOptions(kv_bytes=5760, kv_rope_dims=(7,)).check()
    with pytest.raises(ValueError, match="give --kv-bytes too"):
        ConvertOptions(kv_rope_dims=(64,)).check()
