"""The backend seam: the selection point, and a backend that overrides only the kernels."""

import pytest
import torch

from latentkv import attention
from latentkv.kernels import attention as attention_kernels, build
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
    with pytest.raises(
        ValueError,
        match=r"attention backend 'cuda-mla' is not available; expected one of \['auto', 'native', 'torch'\]",
    ):
        attention.get_backend("cuda-mla")


@torch.inference_mode()
def test_a_registered_backend_serves_both_paths(tiny_checkpoints, monkeypatch):
    monkeypatch.setitem(attention.BACKENDS, "recording", Recording)
    folder, _ = tiny_checkpoints("v3_dense_qlora")
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    reference = load_model(folder, attention_backend="torch")
    model = load_model(folder, attention_backend="recording")
    for path, kernel in [("naive", "dense"), ("absorbed", "latent")]:
        Recording.calls.clear()
        assert torch.equal(model.full_logits(ids, path=path), reference.full_logits(ids, path=path))
        assert Recording.calls == [kernel] * model.config.num_hidden_layers


@torch.inference_mode()
def test_without_the_native_build_auto_falls_back_with_one_warning(tiny_checkpoints, monkeypatch):
    """A machine with no compiler (here: the compiler "fails"): one warning, the reference backend."""

    def fail(*args, **kwargs):
        raise OSError("no compiler\ng++: not found")

    monkeypatch.setattr(attention_kernels.EXT, "state", {})  # forget this process's build
    monkeypatch.setattr(build, "compile_extension", fail)
    with pytest.warns(
        RuntimeWarning,
        match="native CPU attention kernel is unavailable .*g\\+\\+: not found.*using the PyTorch reference backend",
    ) as caught:
        folder, _ = tiny_checkpoints("v3_dense_qlora")
        model = load_model(folder)  # "auto"
        load_model(folder)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert isinstance(model.model.layers[0].self_attn.backend, TorchBackend)
    with pytest.raises(RuntimeError, match=r"native attention backend is not available here \(.*g\+\+: not found"):
        attention.get_backend("native")


def test_auto_is_native_where_it_builds():
    if not attention_kernels.available():
        pytest.skip(f"native backend not built: {attention_kernels.unavailable_reason()}")
    assert attention.get_backend("auto").name == "native"
