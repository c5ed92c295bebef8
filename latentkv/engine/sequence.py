"""One request's state as the scheduler, block pool and runner see it."""

from __future__ import annotations

import enum
import itertools
import time

import torch

from latentkv.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_arrival = itertools.count()


class Sequence:
    """Token ids (prompt then output), block table and progress of one sample stream.

    `num_computed_tokens` tokens have their latents in the cache; the rest of
    `token_ids` still has to go through the model. `num_cached_tokens` of those came
    from prefix-cache hits (no compute). After a preemption both drop to 0 and the
    whole prompt plus the output so far is recomputed.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        index: int = 0,
        prompt: str | None = None,
    ):
        self.request_id = request_id
        self.index = index  # which of the request's n samples
        self.prompt = prompt
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = Status.WAITING
        self.arrival = next(_arrival)
        self.arrival_time = time.monotonic()  # time.monotonic() seconds
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of full blocks, grown lazily
        self.num_registered_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        # Sampling state. A seeded request owns its generator so its draws do not
        # depend on which other requests share the batch.
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[dict | None] | None = [None] if params.prompt_logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.guide = None  # its grammar matcher with guided decoding (latentkv/guided.py)
        # Detokenizer state (see engine/detokenizer.py).
        self.text = ""
        self.prefix_offset = max(self.num_prompt_tokens - 5, 0)
        self.read_offset = self.num_prompt_tokens

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id}#{self.index}, {self.status.value}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Still collecting prompt logprobs: needs logits of every prompt position."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def finish(self, reason: str, stop_reason: int | str | None = None, error: str | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.error = error

    def reset_for_recompute(self) -> None:
        """After preemption: no blocks, nothing computed; the latents are rebuilt later."""
        self.block_table = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_registered_blocks = 0
        self.status = Status.WAITING
