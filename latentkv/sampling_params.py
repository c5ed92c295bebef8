"""`SamplingParams`: how one request picks its tokens (vLLM's names and meanings)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from latentkv.guided import GuidedDecodingParams


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 or -1: all). top_p: nucleus mass in (0, 1].
    min_p: drop tokens whose probability is below min_p × the top probability.
    repetition_penalty: >1 discourages tokens seen in prompt or output (CTRL-style:
    positive logits divided, negative multiplied). presence_penalty / frequency_penalty:
    subtracted once / per occurrence for tokens in the output so far.
    seed: makes this request's sampling reproducible whatever else runs in the batch.
    stop: strings that end generation; the matched string is not part of the text.
    stop_token_ids: token ids that end generation (like EOS; the id is in token_ids, not text).
    max_tokens: generated tokens at most (None: until max_model_len). min_tokens: EOS and
    stop_token_ids are masked until this many were generated. ignore_eos: do not stop at EOS.
    logprobs: number of top log-probabilities returned per generated token (the chosen
    token is always included). prompt_logprobs: the same for each prompt token.
    n: independent samples per prompt.
    skip_special_tokens: leave special tokens out of the text.
    guided_decoding: a JSON schema, regex, choice or grammar the output must match
    (latentkv/guided.py); each sample is masked by its own matcher.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        if self.top_k == -1:
            self.top_k = 0
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5  # (as vLLM) smaller temperatures are greedy in all but float noise

    def validate(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check(
                isinstance(value, (int, float)) and math.isfinite(value),
                f"{name} must be a finite number, got {value!r}",
            )
        check(isinstance(self.n, int) and self.n >= 1, f"n must be an int >= 1, got {self.n!r}")
        check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            f"top_k must be -1, 0 (off) or a positive int, got {self.top_k!r}",
        )
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        check(self.repetition_penalty > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        check(
            -2.0 <= self.frequency_penalty <= 2.0, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"
        )
        check(
            self.seed is None or (isinstance(self.seed, int) and -(2**63) <= self.seed < 2**63),
            f"seed must be an int in [-2**63, 2**63) or None, got {self.seed!r}",
        )
        check(all(isinstance(s, str) and s for s in self.stop), f"stop must be non-empty strings, got {self.stop!r}")
        check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            f"max_tokens must be an int >= 1 or None, got {self.max_tokens!r}",
        )
        check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            f"min_tokens must be an int >= 0, got {self.min_tokens!r}",
        )
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(
                value is None or (isinstance(value, int) and value >= 0),
                f"{name} must be an int >= 0 or None, got {value!r}",
            )
        check(
            self.guided_decoding is None or isinstance(self.guided_decoding, GuidedDecodingParams),
            f"guided_decoding must be a GuidedDecodingParams or None, got {self.guided_decoding!r}",
        )

    def for_sample(self, index: int) -> "SamplingParams":
        """Params of the `index`-th of `n` samples: n=1 each, seed offset so samples differ."""
        if self.n == 1:
            return self
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed, stop=list(self.stop))


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
