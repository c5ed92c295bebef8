"""EOS ids come from generation_config.json, else config.json."""

import json
import shutil

from latentkv import LLM


def test_eos_from_config_json_when_no_generation_config(tiny_checkpoints, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_checkpoints("v2_dense")[0], folder)
    (folder / "generation_config.json").unlink(missing_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eos_token_id"] = 7
    (folder / "config.json").write_text(json.dumps(cfg))
    llm = LLM(model=str(folder), skip_tokenizer_init=True, kv_cache_memory="1MiB")
    assert llm.engine.eos_token_ids == [7]
