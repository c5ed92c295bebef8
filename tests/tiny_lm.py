"""Tiny DeepSeek checkpoints *with a tokenizer* (engine, server, CLI and healing tests).

The shapes come from tests/tiny.py; the vocabulary is 320 so a byte-level BPE
tokenizer (256 byte symbols + merges + <s>, </s>) fits, which lets the tests cover
characters split over several tokens. Built without downloads.
"""

from __future__ import annotations

import torch
from tiny import BASE, CONFIGS

VOCAB = 320
CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 4,
    "héllo wörld, ça va? naïve café. 日本語のテキスト。 emoji 😀🎉 and more text " * 3,
    "one two three four five six seven eight nine ten eleven twelve",
    "def main(): return 42  # code-like text with symbols {}[]()<>",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() <= VOCAB
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(name: str, seed: int = 0):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    kind, overrides = CONFIGS[name]
    cfg_cls, model_cls = (
        (DeepseekV2Config, DeepseekV2ForCausalLM) if kind == "v2" else (DeepseekV3Config, DeepseekV3ForCausalLM)
    )
    # A wider init than the default 0.02 gives peaked logits, so greedy choices are not
    # decided by float noise between implementations.
    cfg = cfg_cls(
        **{**BASE, **overrides, "vocab_size": VOCAB, "initializer_range": 0.1, "bos_token_id": 0, "eos_token_id": 1}
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.2)
    return model


def save_tiny_llama(folder, seed: int = 0, **shape):
    """A random Llama HF folder (a conversion source) with this tokenizer and chat template; shape:
    LlamaConfig fields to change (e.g. num_attention_heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.1,
    )
    cfg = LlamaConfig(**{**fields, **shape})
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    build_tokenizer().save_pretrained(str(folder))
    return folder


def save_tiny_lm(folder, name: str = "v3_dense_qlora", tokenizer: bool = True):
    """Write a tiny model (and its tokenizer) to `folder`; returns (model, tokenizer or None)."""
    model = build_model(name)
    model.save_pretrained(folder)
    tok = build_tokenizer() if tokenizer else None
    if tok is not None:
        tok.save_pretrained(folder)
    return model, tok
