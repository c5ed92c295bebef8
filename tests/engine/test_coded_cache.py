"""A folder that records a transform-coded cache (latentkv.cache_format) served by the engine: the format
comes from the folder, the cache holds its bytes, its native decode kernel reads it (all-decode steps in the
decode plan, the others in the layers: tokens written by one are read by the other), and what it computes is
the simulated reference's (convert/simulated.py, the conversion's measurements): prompt logprobs within
float noise, greedy tokens identical alone / batched / chunked / prefix-cached, and through the KV store."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tiny_lm import save_tiny_llama

from latentkv import LLM, SamplingParams
from latentkv.cache import transform_code as tc
from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.convert.api import convert
from latentkv.convert.options import ConvertOptions
from latentkv.convert.simulated import simulate
from latentkv.facts import TRANSFORM_CODE
from latentkv.model.loader import load_model

BS = 4
N_TOKENS = 12


@pytest.fixture(scope="module")
def coded_folder(tmp_path_factory):
    """A tiny Llama converted exactly in the PCA basis (what --kv-bytes codes), its config given a
    centred transform code of 0-8 bits a direction, layers apart -> (folder, the code)."""
    root = tmp_path_factory.mktemp("coded")
    options = ConvertOptions(
        rope_dim="all", kv_rank="full", rotate_latent=False, calib_tokens=4 * 64, ctx=64, eval_tokens=0
    )
    out = convert(str(save_tiny_llama(root / "llama")), root / "mla", options)
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    model = ModelConfig.from_dict(cfg)
    rng = random.Random(0)
    layers, dr = model.num_hidden_layers, model.qk_rope_head_dim
    latent = [[rng.choice((0, 3, 4, 6, 8)) for _ in range(model.kv_rank(i))] for i in range(layers)]
    rope = [[rng.choice((2, 5, 8)) if i else 6 for _ in range(dr)] for i in range(layers)]
    means = (
        [[rng.uniform(-0.1, 0.1) for _ in range(model.kv_rank(i))] for i in range(layers)],
        [[rng.uniform(-0.5, 0.5) for _ in range(dr)] for _ in range(layers)],
    )
    code = tc.TransformCode(tuple(map(tuple, latent)), tuple(map(tuple, rope)), 8).centred(*means)
    cfg["latentkv"].pop("cache_dtype", None)
    cfg["latentkv"]["cache_format"] = code.to_dict()
    path.write_text(json.dumps(cfg))
    return out, code


def make_llm(folder, **kw):
    return LLM(str(folder), **{"dtype": "float32", "block_size": BS, "kv_cache_memory": "2MiB", "seed": 0, **kw})


def requests(n=8, seed=3, vocab=300):
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(5, 40))] for _ in range(n)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(4, N_TOKENS), ignore_eos=True) for _ in range(n)]
    return prompts, params


def greedy(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_the_folder_is_served_in_its_format_with_its_bytes(coded_folder, capsys):
    folder, code = coded_folder
    llm = make_llm(folder)
    engine = llm.llm_engine
    assert engine.args.kv_cache_dtype == TRANSFORM_CODE and engine.model.route.attention == "native"
    assert engine.runner.plan is not None  # all-decode steps in one native call (model/decode_plan.py)
    assert engine.kv_bytes_per_token == code.bytes_per_token() == latent_bytes_per_token(engine.cfg, TRANSFORM_CODE)
    assert [c.nbytes() // engine.capacity_tokens for c in engine.runner.caches] == [
        code.layer_bytes(i) for i in range(len(code.latent_bits))
    ]
    route = [line for line in capsys.readouterr().err.splitlines() if "route:" in line][-1]
    assert "cache transform_code" in route and "decode native coded kernel" in route
    assert "decode plan on" in route


def test_prompt_logprobs_and_greedy_tokens_are_the_simulated_references(coded_folder):
    folder, code = coded_folder
    prompt = list(range(40, 75))
    params = SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True, prompt_logprobs=1)
    out = make_llm(folder).generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    reference = simulate(load_model(str(folder), dtype=torch.float32), code)
    tokens = prompt + list(out.outputs[0].token_ids)
    logits = reference.full_logits(torch.tensor([tokens]), cache_dtype="auto")[0]
    logprobs = logits.log_softmax(-1)
    for p in range(1, len(prompt)):
        assert out.prompt_logprobs[p][prompt[p]].logprob == pytest.approx(logprobs[p - 1, prompt[p]].item(), abs=1e-4)
    # the served answer is the reference's greedy one: each token its argmax after the ones before
    assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == list(out.outputs[0].token_ids)
    # and the code matters: the unquantized latent answers otherwise somewhere on this prompt
    plain = load_model(str(folder), dtype=torch.float32).full_logits(torch.tensor([tokens]), cache_dtype="auto")[0]
    assert (plain - logits).abs().max() > 1e-3


def test_greedy_is_identical_alone_batched_chunked_and_cached(coded_folder):
    folder, _ = coded_folder
    prompts, params = requests()
    plain = make_llm(folder, enable_prefix_caching=False, max_num_seqs=8)
    alone = [greedy(plain, [p], [sp])[0] for p, sp in zip(prompts, params)]
    assert greedy(plain, prompts, params) == alone
    chunked = make_llm(folder, enable_prefix_caching=False, max_num_seqs=8, max_num_batched_tokens=8)
    assert greedy(chunked, prompts, params) == alone
    cached = make_llm(folder, max_num_seqs=8)
    assert greedy(cached, prompts, params) == alone
    assert greedy(cached, prompts, params) == alone and cached.engine.stats()["prefix_hits"] > 0


def test_blocks_written_to_the_store_and_read_back_give_the_same_text(coded_folder, tmp_path):
    folder, _ = coded_folder
    prefix = list(range(10, 10 + 6 * BS))
    first, second = prefix + [200, 201, 202], prefix + [210, 211]
    params = SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True)
    cold = greedy(make_llm(folder), [second], [params])
    llm = make_llm(folder, kv_store=str(tmp_path / "store"))
    greedy(llm, [first], [params])
    llm.engine.close()
    warm = make_llm(folder, kv_store=str(tmp_path / "store"))
    assert greedy(warm, [second], [params]) == cold
    stats = warm.engine.stats()
    assert stats["store_hits"] == 6 and stats["store_corrupt_blocks"] == 0


def test_a_cache_asked_by_name_is_refused_and_the_native_backend_too(coded_folder, tmp_path):
    folder, _ = coded_folder
    for asked in ("int8", "q4_0", "float32"):
        with pytest.raises(ValueError, match=f"kv_cache_dtype '{asked}': this folder's cache is a transform code"):
            make_llm(folder, kv_cache_dtype=asked)
    assert make_llm(folder, kv_cache_dtype=TRANSFORM_CODE).llm_engine.args.kv_cache_dtype == TRANSFORM_CODE
    prompts, params = requests(3)
    assert greedy(make_llm(folder, attention_backend="native"), prompts, params) == greedy(
        make_llm(folder, attention_backend="torch"), prompts, params
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in folder.iterdir():
        (plain / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((plain / "config.json").read_text())
    del cfg["latentkv"]["cache_format"]
    (plain / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="this folder records no transform code"):
        make_llm(plain, kv_cache_dtype=TRANSFORM_CODE)
