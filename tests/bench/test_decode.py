"""`bench decode` runs in --quick mode on a tiny model: the rows asked for (weights, latent dtypes,
attention backend, invariance) and the prompts each system prefills, in turn. No timing assertions:
only that the measurements exist and are sane numbers."""

import argparse

import torch

from bench_cli import positive, run_bench
from latentkv.bench.decode import measure_context
from latentkv.facts import dtype_name
from latentkv.model.loader import resolve_dtype


def test_bench_decode(tiny, tmp_path):
    data = run_bench("decode", tiny, tmp_path, "--stock", tiny)
    assert data["bandwidth_gbs"] > 0 and data["machine"]["cores"] >= 1
    assert [r["context"] for r in data["results"]] == [64, 256]
    for row in data["results"]:
        names = set(row["tok_s"])
        assert {
            "latentkv",
            "latentkv int8 latent",
            "latentkv w4",
            "latentkv w4 + int8 latent",
            "transformers original",
            "transformers DeepseekV3 stock",
        } <= names
        assert all(positive(v) for v in row["tok_s"].values())
        assert row["ratio"]["latentkv"] == 1.0
        assert positive(row["floor_fraction"])
        assert set(row["speedup"]["latentkv w4"]) == {"transformers original", "transformers DeepseekV3 stock"}
        assert all(positive(v) for v in row["floor_fractions"].values())
        assert set(row["prefill_tok_s"]) == names and all(positive(v) for v in row["prefill_tok_s"].values())
    assert data["weight_bytes"]["latentkv w4"] < data["weight_bytes"]["latentkv"]


class Recorder:
    """A bench system that logs what it is asked: (name, prompt's first token) per prepare, and
    decode runs on the last prompt prepared."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def prepare(self, prompt_ids):
        self.log.append((self.name, prompt_ids[0]))
        self.last = prompt_ids[0]

    def decode(self, n):
        return 0.01 * self.last


def test_bench_decode_prefills_every_prompt_interleaved_and_decodes_the_last():
    log = []
    prefill, times = measure_context(
        [Recorder("a", log), Recorder("b", log)],
        [[1] * 4, [2] * 4, [3] * 4],
        argparse.Namespace(tokens=2, repeats=2),
        {},
    )
    assert log == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert set(prefill) == {"a", "b"} and all(positive(v) for v in prefill.values())
    assert times == {"a": [0.03, 0.03], "b": [0.03, 0.03]}


def test_bench_decode_prefill_repeats(tiny, tmp_path):
    data = run_bench(
        "decode",
        tiny,
        tmp_path,
        "--no-baselines",
        "--weights",
        "none",
        "--kv-cache-dtypes",
        "auto",
        "--prefill-repeats",
        "2",
    )
    assert all(r["prefill_prompts"] == 2 and positive(r["prefill_tok_s"]["latentkv"]) for r in data["results"])


def decode_row(tiny, tmp_path, *flags):
    """The one row (context 64) of `bench decode --quick --no-baselines *flags` on the tiny model."""
    return run_bench("decode", tiny, tmp_path, "--no-baselines", "--contexts", "64", *flags)["results"][0]


def test_bench_decode_native_vs_reference_attention_and_invariance_cost(tiny, tmp_path):
    row = decode_row(tiny, tmp_path, "--reference-attention", "--not-invariant")
    for name in ("latentkv", "latentkv w4 + int8 latent"):
        assert positive(row["tok_s"][name]) and positive(row["tok_s"][f"{name} (torch attention)"])
        assert positive(row["ratio"][f"{name} (torch attention)"])
        for variant in (name, f"{name} (torch attention)"):  # every latentkv row, batch_invariant off beside it
            assert positive(row["tok_s"][f"{variant} (not invariant)"])
            assert positive(row["prefill_tok_s"][f"{variant} (not invariant)"])


def test_bench_decode_runs_only_the_weight_precisions_asked_for(tiny, tmp_path):
    row = decode_row(tiny, tmp_path, "--weights", "int4")
    assert set(row["tok_s"]) == {"latentkv w4", "latentkv w4 + int8 latent"}
    assert row["ratio"]["latentkv w4"] == 1.0  # the ratios are taken against the first row run


def test_bench_decode_runs_only_the_latent_dtypes_asked_for(tiny, tmp_path):
    row = decode_row(tiny, tmp_path, "--weights", "none", "int4", "--kv-cache-dtypes", "int8")
    assert set(row["tok_s"]) == {"latentkv int8 latent", "latentkv w4 + int8 latent"}


def test_bench_decode_runs_the_unquantized_latent_by_the_model_dtypes_name(tiny, tmp_path):
    name = dtype_name(resolve_dtype("auto", torch.device("cpu")))  # the dtype the bench's model runs in here
    row = decode_row(tiny, tmp_path, "--weights", "none", "--kv-cache-dtypes", "int8", name)
    assert set(row["tok_s"]) == {"latentkv int8 latent", f"latentkv {name} latent"}
