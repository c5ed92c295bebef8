"""The backend seam: the selection point, and a backend that overrides only the kernels."""
import pytest
import torch

from latentkv import attention
from latentkv.attention.torch_ref import TorchBackend
from latentkv.model.loader import load_model


class Recording(TorchBackend):
    """The reference backend with every kernel call logged (what a native backend replaces)."""

    name = "recording"
    calls: list[str] = []

    def latent_attention(self, query, cache, meta):
        self.calls.append("latent")
        return super().latent_attention(query, cache, meta)

    def dense_attention(self, query, key, value, meta, scale):
        self.calls.append("dense")
        return super().dense_attention(query, key, value, meta, scale)


def test_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"attention backend 'cuda-mla' is not available; expected one of \['torch'\]"):
        attention.get_backend("cuda-mla")


@torch.inference_mode()
def test_a_registered_backend_serves_both_paths(tiny_checkpoints, monkeypatch):
    monkeypatch.setitem(attention.BACKENDS, "recording", Recording)
    folder, _ = tiny_checkpoints("v3_dense_qlora")
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    reference = load_model(folder)
    model = load_model(folder, attention_backend="recording")
    for path, kernel in [("naive", "dense"), ("absorbed", "latent")]:
        Recording.calls.clear()
        assert torch.equal(model.full_logits(ids, path=path), reference.full_logits(ids, path=path))
        assert Recording.calls == [kernel] * model.config.num_hidden_layers
