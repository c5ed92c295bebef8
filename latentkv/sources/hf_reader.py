"""Read a Hugging Face folder (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM).

Safetensors only (nothing is unpickled). Anything the converter cannot express exactly
is refused with a message naming it: QK-norm (Qwen3), sliding-window attention, MoE,
attention-output or MLP biases, RoPE types that rescale attention.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from latentkv.rope import default_inv_freq
from latentkv.sources.source_model import SourceError, SourceModel, check_tensors
from latentkv.sources.tensor_store import TensorStore, resident_default

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}
KNOWN_UNSUPPORTED = {
    "Qwen3ForCausalLM": "QK-norm (q_norm / k_norm, Qwen3)",
    "Qwen3MoeForCausalLM": "QK-norm and mixture of experts (Qwen3-MoE)",
    "Gemma2ForCausalLM": "sliding windows and logit soft-capping (Gemma2)",
    "MixtralForCausalLM": "mixture of experts (Mixtral)",
    "DeepseekV3ForCausalLM": "a model that already uses MLA (DeepSeek-V3)",
}


def read_config(path: Path) -> dict:
    """config.json as a dict, with a clear error when absent or malformed."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise SourceError(f"{path}: no config.json (a source is a .gguf file or a Hugging Face model folder)")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise SourceError(f"{cfg_path}: not valid JSON ({err})") from err


def check_supported(path: Path, cfg: dict) -> str:
    """The source arch ("llama"/"qwen2"/"mistral"), or SourceError naming what is unsupported."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else f"model_type={cfg.get('model_type')!r}"
    if arch in KNOWN_UNSUPPORTED:
        raise SourceError(f"{path}: {arch} is not supported: {KNOWN_UNSUPPORTED[arch]}")
    if arch not in SUPPORTED:
        raise SourceError(f"{path}: architecture {arch} is not supported (supported: {', '.join(SUPPORTED)})")
    if cfg.get("use_qk_norm") or cfg.get("qk_norm"):
        raise SourceError(f"{path}: unsupported: QK-norm")
    window = cfg.get("sliding_window")
    uses_window = cfg.get("use_sliding_window", SUPPORTED[arch] == "mistral")
    if window and uses_window:
        raise SourceError(f"{path}: unsupported: sliding-window attention (sliding_window={window})")
    if cfg.get("layer_types") and any(t != "full_attention" for t in cfg["layer_types"]):
        raise SourceError(f"{path}: unsupported: sliding-window attention (layer_types)")
    if cfg.get("mlp_bias"):
        raise SourceError(f"{path}: unsupported: MLP biases (mlp_bias)")
    if SUPPORTED[arch] == "llama" and cfg.get("attention_bias"):
        raise SourceError(f"{path}: unsupported: attention biases on a Llama model (attention_bias)")
    return SUPPORTED[arch]


def read_safetensors(path: Path, resident_limit: int | None = None) -> TensorStore:
    """The tensors of the folder's *.safetensors files, read one at a time as float32."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (found {', '.join(pickled)}: pickled weights are never loaded)" if pickled else ""
        raise SourceError(f"{path}: no *.safetensors files{hint}")
    shapes, where = {}, {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
                    where[name] = file
        except Exception as err:
            raise SourceError(f"{file}: not a readable safetensors file ({type(err).__name__}: {err})") from err

    def read(name: str) -> torch.Tensor:
        try:
            with safe_open(str(where[name]), framework="pt") as f:
                return f.get_tensor(name).float()
        except Exception as err:
            raise SourceError(f"{where[name]}: cannot read tensor {name} ({type(err).__name__}: {err})") from err

    return TensorStore(shapes, read, resident_default(shapes, resident_limit))


def rope_frequencies(path: Path, hf_cfg) -> tuple[torch.Tensor, float]:
    """(inv_freq [d/2], rope_theta) from transformers' own RoPE init for this config."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(hf_cfg, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    kind = params.get("rope_type", "default")
    theta = float(params.get("rope_theta", 10000.0))
    if kind == "default":
        return default_inv_freq(hf_cfg.head_dim, theta), theta
    if kind not in ROPE_INIT_FUNCTIONS:
        raise SourceError(f"{path}: unsupported: RoPE type {kind!r}")
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    if abs(float(attention_factor) - 1.0) > 1e-6 or kind in ("dynamic", "longrope"):
        raise SourceError(f"{path}: unsupported: RoPE type {kind!r} (rescales attention or depends on length)")
    return inv_freq.float(), theta


def read_hf_folder(path: Path, resident_limit: int | None = None) -> SourceModel:
    """Read a supported Hugging Face folder into a SourceModel (float32 tensors, read on use;
    kept in memory when their float32 size is within resident_limit, tensor_store.py)."""
    from transformers import AutoConfig

    cfg = read_config(path)
    arch = check_supported(path, cfg)
    hf_cfg = AutoConfig.from_pretrained(str(path))
    if getattr(hf_cfg, "head_dim", None) is None:
        hf_cfg.head_dim = hf_cfg.hidden_size // hf_cfg.num_attention_heads
    inv_freq, theta = rope_frequencies(path, hf_cfg)
    tensors = read_safetensors(path, resident_limit)
    if any("q_norm" in n or "k_norm" in n for n in tensors):
        raise SourceError(f"{path}: unsupported: QK-norm tensors (q_norm / k_norm)")
    tie = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    if tie:
        tensors.drop("lm_head.weight")
    elif "lm_head.weight" not in tensors:
        raise SourceError(f"{path}: missing tensor lm_head.weight")
    source = SourceModel(
        path=path,
        kind="hf",
        arch=arch,
        vocab_size=hf_cfg.vocab_size,
        hidden_size=hf_cfg.hidden_size,
        intermediate_size=hf_cfg.intermediate_size,
        num_layers=hf_cfg.num_hidden_layers,
        num_heads=hf_cfg.num_attention_heads,
        num_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or hf_cfg.num_attention_heads,
        head_dim=hf_cfg.head_dim,
        rms_norm_eps=hf_cfg.rms_norm_eps,
        rope_theta=theta,
        inv_freq=inv_freq,
        max_position_embeddings=getattr(hf_cfg, "max_position_embeddings", 4096),
        tie_word_embeddings=tie,
        qkv_bias=arch == "qwen2",
        bos_token_id=getattr(hf_cfg, "bos_token_id", None),
        eos_token_id=getattr(hf_cfg, "eos_token_id", None),
        chat_template=read_chat_template(path),
        tensors=tensors,
    )
    check_tensors(source)
    return source


def read_chat_template(path: Path) -> str | None:
    """The chat template from tokenizer_config.json or chat_template.jinja, if any."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        template = json.loads(tok_cfg.read_text()).get("chat_template")
        return template if isinstance(template, str) else None
    return None
