"""A folder's tokenizer as GGUF `tokenizer.ggml.*` metadata, the way llama.cpp's convert_hf_to_gguf
writes a byte-level BPE vocabulary (model "gpt2"): tokens and their types, merges, special ids,
add-bos/eos flags and the chat template (the last three by gguf.SpecialVocab).

llama.cpp refuses a GGUF whose `tokenizer.ggml.pre` (the pre-tokenizer: how text is split before
BPE) it does not know. convert_hf_to_gguf names it by hashing the token ids of a fixed text
(`CHKTXT`) and looking the hash up in a table generated from the models it knows; `pre_tokenizer`
does the same for the families latentkv serves and converts, recognizes a plain GPT-2 byte-level
splitter by its tokenizer.json, and otherwise asks for `--tokenizer-pre`.
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path

import gguf
from transformers import AutoTokenizer

from latentkv.export.gguf_check import ExportError

# convert_hf_to_gguf.py's `chktxt` (llama.cpp, get_vocab_base_pre), character for character: the
# hashes below are of the token ids a tokenizer gives for it.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f "
    "(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333 "
    "3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785"
    "\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# sha256 of str(tokenizer.encode(CHKTXT)) -> llama.cpp's pre-tokenizer name, for the model families
# latentkv converts (Llama 3, Qwen2, SmolLM, Mistral Nemo) and DeepSeek's own; from llama.cpp's
# convert_hf_to_gguf.py get_vocab_base_pre (the reference model in each comment).
KNOWN_PRE = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # mistralai/Mistral-Nemo-Base-2407
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",  # deepseek-llm-7b-base
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",  # deepseek-coder-6.7b-base
    "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5": "deepseek-v3",  # deepseek-ai/DeepSeek-V3
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",  # DeepSeek-R1-Distill-Qwen
}
# A tokenizer.json whose only pre-tokenizer is this splits text with GPT-2's regex, which is
# llama.cpp's "gpt-2" pre-tokenizer exactly.
GPT2_SPLITTER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def add_vocab(writer: gguf.GGUFWriter, folder: Path, vocab_size: int, pre: str | None = None) -> str:
    """Write the tokenizer of `folder` (tokenizer.json, tokenizer_config.json) for a model of
    `vocab_size` rows: ids the tokenizer lacks become `[PAD{i}]` tokens of type UNUSED, as
    convert_hf_to_gguf writes them. `pre`: llama.cpp's pre-tokenizer name (None: detected).
    Returns the pre-tokenizer written."""
    spec = tokenizer_spec(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokens, types = token_list(tokenizer, vocab_size, folder)
    pre = pre or pre_tokenizer(tokenizer, spec, folder)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    if not special.merges:
        raise ExportError(
            f"{folder / 'tokenizer.json'}: no BPE merges (model.merges); llama.cpp's gpt2 tokenizer needs them"
        )
    # llama.cpp's default depends on the pre-tokenizer: say what the folder's tokenizer does
    special.add_special_token.update(adds_special(tokenizer))
    special.add_to_gguf(writer, quiet=True)
    return pre


def adds_special(tokenizer) -> dict[str, bool]:
    """Whether encoding a text puts BOS before it and EOS after it (add_bos_token / add_eos_token)."""
    plain, full = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a")
    added = len(full) > len(plain)
    return {"bos": added and full[0] == tokenizer.bos_token_id, "eos": added and full[-1] == tokenizer.eos_token_id}


def tokenizer_spec(folder: Path) -> dict:
    """tokenizer.json, checked to be a byte-level BPE tokenizer (what GGUF's "gpt2" model is)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ExportError(
            f"{folder}: no tokenizer.json; a GGUF carries its tokenizer, so the folder needs one "
            "(latentkv convert writes it beside the weights)"
        )
    try:
        spec = json.loads(path.read_text())
        kind = spec["model"]["type"]
    except (ValueError, KeyError, TypeError) as err:
        raise ExportError(f"{path}: not a tokenizers JSON file ({type(err).__name__}: {err})") from None
    if kind != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise ExportError(
            f"{path}: a {kind} tokenizer without a byte-level pre-tokenizer; the GGUF export writes "
            "byte-level BPE (GPT-2 style) vocabularies only (SentencePiece-style ones are not supported yet)"
        )
    return spec


def token_list(tokenizer, vocab_size: int, folder: Path) -> tuple[list[str], list[int]]:
    """(tokens, token types) for ids 0..vocab_size-1, as convert_hf_to_gguf's get_vocab_base."""
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise ExportError(
            f"{folder}: the tokenizer has id {max(vocab.values())} but the model's vocab_size is "
            f"{vocab_size}: its embedding has no row for it"
        )
    by_id = {i: token for token, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def pre_tokenizer(tokenizer, spec: dict, folder: Path) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer: by convert_hf_to_gguf's hash, else a
    plain GPT-2 byte-level splitter, else an error asking for the name."""
    digest = sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest()
    if digest in KNOWN_PRE:
        return KNOWN_PRE[digest]
    splitter = spec.get("pre_tokenizer") or {}
    plain = {k: splitter.get(k) for k in GPT2_SPLITTER} == GPT2_SPLITTER and not spec.get("normalizer")
    if plain:
        return "gpt-2"
    raise ExportError(
        f"{folder}: cannot tell which of llama.cpp's pre-tokenizers this tokenizer uses (its "
        f"convert_hf_to_gguf hash {digest} is not one latentkv knows); pass it with --tokenizer-pre "
        "NAME (e.g. llama-bpe, qwen2, smollm, deepseek-v3: llama.cpp's src/llama-vocab.cpp lists them)"
    )
