"""The tiny Llama teacher and its conversions, shared by the healing tests."""

from dataclasses import replace

import pytest
import torch
from tiny_lm import CORPUS, VOCAB, build_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from latentkv.convert import ConvertOptions, convert
from latentkv.heal import HealConfig


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(tiny Llama folder with tokenizer, its native conversion, its stock conversion, a text file)."""
    root = tmp_path_factory.mktemp("heal")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(root / "llama")
    build_tokenizer().save_pretrained(root / "llama")
    text = root / "train.txt"
    text.write_text("\n".join(CORPUS * 20))
    options = ConvertOptions(rope_dim=8, kv_rank=6, calib=[str(text)], calib_tokens=2048)
    native = convert(str(root / "llama"), str(root / "native"), options)
    stock = convert(str(root / "llama"), str(root / "stock"), replace(options, stock=True, target="any"))
    return root / "llama", native, stock, text


@pytest.fixture
def heal_settings(tiny_pair):
    """(out, **changes) -> the tests' HealConfig: 20 steps of the native conversion on the text file, documents only."""
    teacher, native, _, text = tiny_pair

    def settings(out, **changes) -> HealConfig:
        cfg = dict(
            converted=str(native),
            teacher=str(teacher),
            data=[str(text)],
            out=str(out),
            steps=20,
            lr=3e-3,
            warmup=2,
            seq_len=32,
            batch=4,
            save_every=10,
            chat_share=0.0,  # documents only: chat in test_heal_chat.py
            eval_examples=0,
        )
        return HealConfig(**{**cfg, **changes})

    return settings
