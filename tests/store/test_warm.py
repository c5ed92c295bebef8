"""Templates (`warm=`) and the `latentkv store` / settings plumbing, on a tiny model."""

from __future__ import annotations

import json

import pytest
from test_tier import BS, GREEDY, make_llm, run

from latentkv.cli import main
from latentkv.settings import SettingsError, build_settings
from latentkv.store.store import SUFFIX

SYSTEM = "the quick brown fox jumps over the lazy dog. " * 3
CONVERSATION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "one two three"}]


def write_templates(path):
    lines = [
        json.dumps(SYSTEM + "def main(): return 42"),
        json.dumps({"messages": CONVERSATION}),
        json.dumps({"prompt_token_ids": list(range(2, 2 + 5 * BS))}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_warm_pins_templates_within_fraction_and_writes_them(lm_folder, tmp_path):
    folder = lm_folder()
    templates = write_templates(tmp_path / "t.jsonl")
    llm = make_llm(
        folder, kv_cache_memory=200 * BS * 288, kv_store=str(tmp_path / "store"), warm=str(templates), warm_fraction=0.1
    )
    engine = llm.engine
    assert 0 < len(engine.pinned_blocks) <= 0.1 * engine.pool.num_blocks
    assert all(engine.pool.blocks[b].ref_count >= 1 for b in engine.pinned_blocks)
    assert engine.capacity_tokens == (engine.pool.num_blocks - len(engine.pinned_blocks)) * BS
    # a chat request continuing the template conversation hits its pinned blocks
    out = llm.chat(CONVERSATION, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens >= BS
    cold = make_llm(folder).chat(CONVERSATION, GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == cold.outputs[0].token_ids
    engine.close()
    assert len(list((tmp_path / "store").glob(f"*/blocks/*/*{SUFFIX}"))) >= 5


def test_warm_budget_zero_pins_nothing(lm_folder, tmp_path):
    llm = make_llm(lm_folder(), warm=str(write_templates(tmp_path / "t.jsonl")), warm_fraction=0.0)
    assert llm.engine.pinned_blocks == [] and llm.engine.pool.num_used == 0


def test_bad_template_line_is_named(lm_folder, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"fine"\n{"prompt": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        make_llm(lm_folder(), warm=str(bad))


def test_store_settings_from_toml_and_flags(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(
        '[latent_attention.store]\npath = "/tmp/s"\nmax_size = "3GiB"\nwarm = "t.jsonl"\nwarm_fraction = 0.1\n'
    )
    s = build_settings(config, {"kv_store": "/tmp/other"})
    assert (s.kv_store, s.kv_store_max_size, s.warm, s.warm_fraction) == ("/tmp/other", 3 * 2**30, "t.jsonl", 0.1)
    config.write_text("[latent_attention.store]\nwarm_fraction = 2\n")
    with pytest.raises(SettingsError, match="warm_fraction"):
        build_settings(config)
    config.write_text('[latent_attention.store]\nmax_size = "lots"\n')
    with pytest.raises(SettingsError, match="max_size"):
        build_settings(config)


def test_store_cli_warm_ls_clear(lm_folder, tmp_path, capsys):
    store = tmp_path / "store"
    templates = write_templates(tmp_path / "t.jsonl")
    assert (
        main(
            [
                "store",
                "warm",
                str(store),
                str(templates),
                str(lm_folder()),
                "--dtype",
                "float32",
                "--block-size",
                str(BS),
                "--kv-cache-memory",
                "2MiB",
            ]
        )
        == 0
    )
    assert "written to" in capsys.readouterr().out
    files = list(store.glob(f"*/blocks/*/*{SUFFIX}"))
    assert len(files) >= 5
    # a server-like start on the same store and settings reads the warmed blocks
    llm = make_llm(lm_folder(), kv_store=str(store))
    run(llm, list(range(2, 2 + 5 * BS)) + [7, 8])
    assert llm.engine.stats()["store_hits"] == 5
    llm.engine.close()
    files = list(store.glob(f"*/blocks/*/*{SUFFIX}"))
    assert main(["store", "ls", str(store)]) == 0
    listing = capsys.readouterr().out
    assert f"{len(files):8d}" in listing and str(lm_folder()) in listing
    assert main(["store", "clear", str(store)]) == 0
    assert list(store.glob(f"*/blocks/*/*{SUFFIX}")) == []
    assert main(["store", "ls", str(tmp_path / "missing")]) == 2
