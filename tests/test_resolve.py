"""Model resolution: MLA folders as they are, Llama-family sources converted once and
cached by content hash + converter settings."""

from __future__ import annotations

import json
import shutil

import pytest

from latentkv import resolve
from latentkv.resolve import ResolveError, SourceGeometry, resolve_model
from latentkv.sources.readers import default_gguf_path

LLAMA_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 96,
    "vocab_size": 128,
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTKV_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def llama_folder(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (folder / "model.safetensors").write_bytes(b"weights v1")
    return folder


class FakeConverter:
    """Stands in for `latentkv.convert.convert`: copies a tiny MLA checkpoint to `out`."""

    def __init__(self, mla_folder):
        self.mla_folder = mla_folder
        self.calls = []

    def __call__(self, source, out, kv_rank=None, cache_ratio=0.25):
        self.calls.append(source)
        shutil.copytree(self.mla_folder, out)
        return out


def test_mla_folder_is_used_as_is(tiny_checkpoints, cache_dir):
    folder, _ = tiny_checkpoints("v2_dense")
    resolved = resolve_model(folder, convert_fn=lambda **kw: pytest.fail("must not convert"))
    assert resolved.path == folder and resolved.source is None and resolved.original is None
    assert not cache_dir.exists()


def test_a_converted_folder_names_its_recorded_source(tiny_checkpoints, llama_folder, tmp_path, cache_dir):
    """A folder `latentkv convert` wrote, given by path: the banner compares its cache with the source's
    (the KV geometry of the model its config records), not with MHA of the latent's shape."""
    folder = tmp_path / "converted"
    shutil.copytree(tiny_checkpoints("v2_dense")[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["latentkv"] = {**cfg.get("latentkv", {}), "source": {"path": str(llama_folder), "kind": "hf"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    resolved = resolve_model(folder, convert_fn=lambda **kw: pytest.fail("must not convert"))
    assert resolved.path == folder and resolved.source == llama_folder
    assert resolved.original == SourceGeometry(num_layers=2, num_kv_heads=2, head_dim=16)
    shutil.rmtree(llama_folder)  # moved or deleted since: nothing to compare with
    assert resolve_model(folder).original is None and not cache_dir.exists()


def test_llama_source_is_converted_once_then_cached(tiny_checkpoints, llama_folder, cache_dir):
    convert = FakeConverter(tiny_checkpoints("v2_dense")[0])
    first = resolve_model(llama_folder, convert_fn=convert, log=lambda m: None)
    second = resolve_model(llama_folder, convert_fn=convert, log=lambda m: None)
    assert convert.calls == [llama_folder]
    assert (first.from_cache, second.from_cache) == (False, True)
    assert first.path == second.path and first.path.parent == cache_dir / "converted"
    assert (first.path / "config.json").is_file() and first.source == llama_folder
    assert first.original == second.original == SourceGeometry(num_layers=2, num_kv_heads=2, head_dim=16)
    assert not list((cache_dir / "converted").glob("*.tmp-*"))


def test_cache_key_follows_content_and_settings(tiny_checkpoints, llama_folder):
    convert = FakeConverter(tiny_checkpoints("v2_dense")[0])
    first = resolve_model(llama_folder, convert_fn=convert, log=lambda m: None)
    (llama_folder / "model.safetensors").write_bytes(b"weights v2")  # new content: convert again
    second = resolve_model(llama_folder, convert_fn=convert, log=lambda m: None)
    assert len(convert.calls) == 2 and second.path != first.path

    def other_defaults(source, out, kv_rank=None, cache_ratio=0.5):  # other default settings: another entry
        return convert(source, out)

    third = resolve_model(llama_folder, convert_fn=other_defaults, log=lambda m: None)
    assert len(convert.calls) == 3 and third.path not in (first.path, second.path)


def test_failed_conversion_leaves_no_cache_entry(llama_folder, cache_dir):
    def broken(source, out):
        out.mkdir()
        (out / "partial").write_text("x")
        raise RuntimeError("converter crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        resolve_model(llama_folder, convert_fn=broken, log=lambda m: None)
    assert not list((cache_dir / "converted").iterdir())


def test_unusable_models_are_named(tmp_path):
    with pytest.raises(ResolveError, match="not found"):
        resolve_model(tmp_path / "absent")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ResolveError, match=r"\.gguf"):
        resolve_model(tmp_path / "weights.bin")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ResolveError, match="'gpt2'"):
        resolve_model(tmp_path / "gpt2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResolveError, match="config.json"):
        resolve_model(tmp_path / "empty")


def test_bundled_gguf_geometry():
    assert resolve.source_geometry(default_gguf_path()) == SourceGeometry(num_layers=30, num_kv_heads=3, head_dim=64)
