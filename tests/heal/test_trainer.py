"""heal/trainer.py's defaults that depend on the machine."""

from latentkv.heal import trainer


def test_autocast_defaults_to_bf16_only_where_it_is_native(monkeypatch):
    """Emulated bf16 (an AVX2-only CPU) made a heal step ~100x slower: the default is float32 there."""
    monkeypatch.setattr(trainer, "native_bf16", lambda: False)
    assert not trainer.use_autocast(None, "cpu") and trainer.use_autocast(None, "cuda")
    monkeypatch.setattr(trainer, "native_bf16", lambda: True)
    assert trainer.use_autocast(None, "cpu")
    assert trainer.use_autocast(True, "cpu") and not trainer.use_autocast(False, "cuda")  # as asked
