"""Our MLA model against transformers' DeepSeek-V2/V3 on tiny random checkpoints."""

import pytest
import torch

from latentkv.attention.metadata import build_metadata
from latentkv.cache.latent_cache import allocate_caches
from latentkv.model.loader import load_model
from latentkv.model.route import decide_route

TOL = 1e-4
LOGPROB_TOL = 1e-3
BLOCK = 4


def run_step(model, caches, tokens, context_len, table, path):
    """Feed `tokens` (the last len(tokens) of context_len) of one sequence; logits [len, vocab]."""
    batch, positions = build_metadata([len(tokens)], [context_len], [table], BLOCK, path=path)
    hidden = model(torch.tensor(tokens), positions, batch, caches)
    return model.compute_logits(hidden)


def incremental_logits(model, ids: list[int], prefill: int, path: str) -> torch.Tensor:
    """Prefill `prefill` tokens, then one token per step, through a paged cache whose
    blocks are deliberately out of order."""
    num_blocks = -(-len(ids) // BLOCK)
    caches = allocate_caches(model.config, num_blocks + 3, BLOCK, torch.float32)
    table = list(range(num_blocks + 2, 2, -1))  # non-contiguous, reversed physical blocks
    out = [run_step(model, caches, ids[:prefill], prefill, table, path)]
    for t in range(prefill, len(ids)):
        out.append(run_step(model, caches, ids[t : t + 1], t + 1, table, path))
    return torch.cat(out)


@torch.inference_mode()
def test_full_sequence_logits_match_transformers(tiny_checkpoints, tiny_name, attention_backend):
    folder, hf = tiny_checkpoints(tiny_name)
    ours = load_model(folder, attention_backend=attention_backend)
    ids = torch.randint(0, hf.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = hf(ids).logits
    for path in ("naive", "absorbed"):
        diff = (ours.full_logits(ids, path=path) - ref).abs().max().item()
        assert diff <= TOL, f"{tiny_name} {path}: max abs logit diff {diff:.2e}"


@torch.inference_mode()
@pytest.mark.parametrize("path", ["naive", "absorbed", "auto"])
def test_incremental_decode_matches_full_sequence(tiny_checkpoints, tiny_name, path, attention_backend):
    folder, hf = tiny_checkpoints(tiny_name)
    ours = load_model(folder, attention_backend=attention_backend)
    ids = torch.randint(0, hf.config.vocab_size, (1, 19), generator=torch.Generator().manual_seed(2))
    full = ours.full_logits(ids, path="naive")[0]
    step = incremental_logits(ours, ids[0].tolist(), prefill=6, path=path)
    diff = (step - full).abs().max().item()
    assert diff <= TOL, f"{tiny_name} {path}: incremental vs full diff {diff:.2e}"


@torch.inference_mode()
def test_mixed_batch_matches_separate_sequences(tiny_checkpoints, attention_backend):
    """One flat batch holding a decode token of one sequence and a prefill chunk of another."""
    folder, _ = tiny_checkpoints("v3_moe_sigmoid")
    model = load_model(folder, attention_backend=attention_backend)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 128, (11,), generator=gen).tolist(), torch.randint(0, 128, (7,), generator=gen).tolist()
    caches = allocate_caches(model.config, 16, BLOCK, torch.float32)
    table_a, table_b = [5, 1, 9], [2, 7]
    run_step(model, caches, a[:10], 10, table_a, "naive")  # a is cached up to token 10
    batch, positions = build_metadata([1, 7], [11, 7], [table_a, table_b], BLOCK)
    logits = model.compute_logits(model(torch.tensor(a[10:] + b), positions, batch, caches))
    ref_a = model.full_logits(torch.tensor([a]))[0, -1]
    ref_b = model.full_logits(torch.tensor([b]))[0]
    assert (logits[0] - ref_a).abs().max().item() <= TOL
    assert (logits[1:] - ref_b).abs().max().item() <= TOL


@torch.inference_mode()
@pytest.mark.parametrize(
    "name", ["v2_moe_group_limited", "v3_moe_sigmoid", "v3_yarn_halves_tied", "v2_lite_moe", "v3_lite_moe"]
)
@pytest.mark.parametrize("invariant", [False, True])  # True: fixed-order linears, each MoE layer one native call
def test_greedy_continuation_matches_transformers_generate(tiny_checkpoints, name, invariant, attention_backend):
    """Greedy tokens identical to transformers' generate, each step's logprobs within LOGPROB_TOL of its logits."""
    folder, hf = tiny_checkpoints(name)
    ours = load_model(folder, route=decide_route("cpu", torch.float32, attention_backend, batch_invariant=invariant))
    moe = [layer.mlp for layer in ours.model.layers if layer.spec.moe]
    assert all((layer.native is not None) == invariant for layer in moe)
    prompt = torch.randint(2, hf.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(4))
    ref = hf.generate(
        prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True
    )

    ids = prompt[0].tolist()
    caches = allocate_caches(ours.config, 8, BLOCK, torch.float32)
    table = list(range(8))
    logits = run_step(ours, caches, ids, len(ids), table, "auto")
    generated, steps = [], []
    for _ in range(16):
        steps.append(logits[-1])
        token = int(logits[-1].argmax())
        generated.append(token)
        ids.append(token)
        logits = run_step(ours, caches, [token], len(ids), table, "auto")
    assert generated == ref.sequences[0, 8:].tolist()
    diff = (torch.stack(steps).log_softmax(-1) - torch.cat(ref.logits).log_softmax(-1)).abs().max().item()
    assert diff <= LOGPROB_TOL, f"{name}: logprobs differ by {diff:.2e}"
