"""Guided decoding (structured outputs): a grammar per sequence, turned into a token mask
before each of its tokens is picked.

The grammar engine is llguidance: on a CPU engine it computes a 49k-token mask in about
0.14 ms per sequence (4.4 ms for 32 sequences, `scripts/grammar_mask_cost.py`; xgrammar
7.3 ms and a ~1 GB triton dependency, outlines-core 11.5 ms), its wheel is 8 MB with no
dependencies, and it compiles a JSON schema lazily, so a new schema costs no start-up.

Every sequence owns its matcher and its mask comes from that matcher alone, so a guided
sequence picks the same tokens whatever shares its batch (batch invariance). Matchers
advance when the engine appends a token, never inside the sampler, so a step that is
rerun (engine/isolation.py) or a preempted sequence that is recomputed moves no matcher
twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance.hf
import llguidance.numpy as lln
import torch
from llguidance import LLMatcher

# A JSON grammar without free whitespace: with it a weak model can pad with spaces or
# newlines until max_tokens and never close the object.
JSON_DEFAULTS = {"whitespace_flexible": False}
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
REGEX_META = set("\\.+*?()|[]{}^$#&-~")  # what the Rust regex syntax lets (and needs) escaped


class GuidedDecodingError(ValueError):
    """A grammar that cannot be compiled; `param` is the request field it came from."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = "invalid_grammar"


@dataclass(frozen=True)
class GuidedDecodingParams:
    """What a request's output must match (vLLM's `GuidedDecodingParams` names); exactly one
    of json / json_object / regex / choice / grammar. `param` names the request field it came
    from, for the error a bad grammar gets."""

    json: dict | str | None = None  # a JSON schema (dict or its text)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | None = None  # one of these strings, verbatim
    grammar: str | None = None  # a Lark grammar in llguidance's dialect
    param: str | None = None

    def __post_init__(self):
        given = [
            self.json is not None,
            self.json_object,
            self.regex is not None,
            self.choice is not None,
            self.grammar is not None,
        ]
        if sum(given) != 1:
            raise GuidedDecodingError(
                "guided decoding needs exactly one of json, json_object, regex, choice, grammar", self.param
            )
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise GuidedDecodingError("choice must be a non-empty list of non-empty strings", self.param)
            object.__setattr__(self, "choice", tuple(self.choice))

    def cache_key(self) -> str:
        json_text = (
            self.json if isinstance(self.json, str) or self.json is None else json.dumps(self.json, sort_keys=True)
        )
        return json.dumps([json_text, self.json_object, self.regex, self.choice, self.grammar])

    def grammar_text(self) -> str:
        """The llguidance grammar (its JSON form) for this request."""
        if self.json is not None or self.json_object:
            schema = {"type": "object"} if self.json_object else self.json
            try:
                if isinstance(schema, str):
                    schema = json.loads(schema)
                text = json.dumps(closed_objects(schema))
                return LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
            except ValueError as err:
                raise GuidedDecodingError(f"{self.param or 'json'}: not a JSON schema: {err}", self.param) from None
        if self.regex is not None:
            return LLMatcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            return LLMatcher.grammar_from_regex("|".join(escape_regex(c) for c in self.choice))
        return LLMatcher.grammar_from_lark(self.grammar)


def closed_objects(schema):
    """The schema with additionalProperties false on every object that lists properties and says
    nothing about others (xgrammar's strict mode, vLLM's default): the output stays valid for the
    schema, and a small model does not invent fields until max_tokens."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):  # name -> schema: the names are not keywords
            out[key] = {name: closed_objects(s) for name, s in value.items()}
        elif key in ("enum", "const", "default", "examples"):
            out[key] = value
        else:
            out[key] = closed_objects(value)
    if (
        isinstance(schema.get("properties"), dict)
        and not {"additionalProperties", "unevaluatedProperties", "patternProperties"} & schema.keys()
    ):
        out["additionalProperties"] = False
    return out


def escape_regex(text: str) -> str:
    return "".join("\\" + c if c in REGEX_META else c for c in text)


class Guides:
    """One engine's grammar machinery: the llguidance view of its tokenizer (built on the
    first guided request: about a second for a 49k vocabulary) and compiled grammars."""

    MAX_CACHED = 128

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._lltokenizer = None
        self.grammars: dict[str, str] = {}  # cache key -> checked grammar

    @property
    def lltokenizer(self):
        if self._lltokenizer is None:
            if self.tokenizer is None:
                raise GuidedDecodingError("guided decoding needs a tokenizer (skip_tokenizer_init=True was given)")
            eos = self.eos_token_ids or None
            self._lltokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=eos)
        return self._lltokenizer

    def compile(self, params: GuidedDecodingParams) -> str:
        """The checked grammar; raises GuidedDecodingError naming the field when it does not compile."""
        key = params.cache_key()
        if key in self.grammars:
            return self.grammars[key]
        try:
            text = params.grammar_text()
            error = LLMatcher.validate_grammar(text, self.lltokenizer)
        except GuidedDecodingError:
            raise
        except Exception as err:  # noqa: BLE001 - whatever the library says about a grammar is the client's 400
            raise GuidedDecodingError(f"{params.param or 'grammar'}: {err}", params.param) from None
        if error:
            raise GuidedDecodingError(f"{params.param or 'grammar'} cannot be compiled: {error.strip()}", params.param)
        if len(self.grammars) >= self.MAX_CACHED:
            self.grammars.pop(next(iter(self.grammars)))
        self.grammars[key] = text
        return text

    def matcher(self, params: GuidedDecodingParams):
        """A fresh matcher (one per sequence) for these params."""
        grammar = self.compile(params)
        try:
            matcher = LLMatcher(self.lltokenizer, grammar)
        except Exception as err:  # noqa: BLE001 - as in compile
            raise GuidedDecodingError(f"{params.param or 'grammar'}: {err}", params.param) from None
        if matcher.is_error():
            raise GuidedDecodingError(f"{params.param or 'grammar'}: {matcher.get_error()}", params.param)
        return matcher


def apply_guides(logits: torch.Tensor, matchers: list, eos_token_ids: list[int]) -> torch.Tensor:
    """Set to -inf every token the row's matcher does not allow (rows whose matcher is None are
    untouched). Each row's mask depends on its own matcher only. A grammar that leaves no
    token at all (one no text of this vocabulary can finish) allows EOS, so the sequence ends."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    vocab = logits.shape[1]
    # llguidance's numpy helpers, not its torch ones: importing llguidance.torch compiles a kernel
    # with torch.compile, which pulls in torch._dynamo (~3 s of every `latentkv` start)
    words = lln.allocate_token_bitmask(len(rows), vocab)
    for j, i in enumerate(rows):
        lln.fill_next_token_bitmask(matchers[i], words, j)
    bitmask = torch.from_numpy(words)
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1  # little-endian bits per int32
    allowed = bits.flatten(1)[:, :vocab].bool()
    stuck = ~allowed.any(dim=-1)
    if bool(stuck.any()):
        eos = [t for t in eos_token_ids if 0 <= t < vocab]
        allowed[stuck.nonzero().flatten()[:, None], torch.tensor(eos, dtype=torch.long)[None, :]] = True
    allowed = allowed.to(logits.device)
    logits = logits.clone()
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits


def advance(matcher, token: int) -> str | None:
    """Feed the sequence's new token to its matcher -> None to go on, "stop" when the grammar
    is complete (nothing may follow), "error: ..." when the token broke it."""
    if not matcher.consume_token(token) or matcher.is_error():
        return f"error: the token {token} does not fit the grammar: {matcher.get_error()}"
    return "stop" if matcher.is_stopped() else None
