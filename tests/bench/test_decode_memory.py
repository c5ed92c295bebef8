"""`bench decode` on a model whose engines do not all fit: the rows are loaded one at a time (each freed
before the next), or the bench refuses before loading anything. The memory available is faked; the
engines are the tiny model's. No timing assertions."""

import gc
import json
import weakref

import pytest

from latentkv.bench import decode
from latentkv.bench.decode import Row, load_row, plan_groups, plan_rows, row_bytes
from latentkv.bench.systems import LatentKVSystem, cache_budget
from latentkv.cli import main

GIB = 2**30
ROWS = [Row("latentkv", "auto"), Row("latentkv int8 latent", "int8"), Row("latentkv w4a8", "auto", "w4a8")]


def test_rows_load_together_when_they_fit_beside_the_baselines():
    need = {"latentkv": 3 * GIB, "latentkv int8 latent": 3 * GIB, "latentkv w4a8": 1 * GIB}
    assert plan_groups(ROWS, need, baselines=2 * GIB, available=10 * GIB) == [ROWS]


def test_rows_that_do_not_fit_together_load_one_at_a_time():
    """The V2-Lite case: an engine per cache dtype beside llama.cpp's GGUF was more than the machine held."""
    need = {"latentkv": 9 * GIB, "latentkv int8 latent": 9 * GIB, "latentkv w4a8": 9 * GIB}
    assert plan_groups(ROWS, need, baselines=8 * GIB, available=22 * GIB) == [[r] for r in ROWS]


def test_a_row_that_does_not_fit_alone_is_refused_with_the_sizes():
    need = {"latentkv": 30 * GIB, "latentkv int8 latent": 9 * GIB, "latentkv w4a8": 9 * GIB}
    with pytest.raises(SystemExit, match=r"'latentkv' needs about 30.0 GiB.*22.0 GiB is available"):
        plan_groups(ROWS, need, baselines=0, available=22 * GIB)
    # the first row is timed beside the baselines: it must fit with them
    need = {"latentkv": 9 * GIB, "latentkv int8 latent": 9 * GIB, "latentkv w4a8": 9 * GIB}
    with pytest.raises(SystemExit, match="beside the baselines' 12.0 GiB"):
        plan_groups(ROWS, need, baselines=12 * GIB, available=22 * GIB)


def test_the_rows_asked_for_and_their_variants(tiny):
    class Args:
        weights, kv_cache_dtypes, reference_attention, not_invariant, eager = (
            ["none", "w4a8"],
            ["auto", "int8"],
            True,
            False,
            False,
        )

    rows = plan_rows(Args)
    assert [r.name for r in rows] == [
        "latentkv",
        "latentkv int8 latent",
        "latentkv w4a8",
        "latentkv w4a8 + int8 latent",
        *(
            f"{n} (torch attention)"
            for n in ("latentkv", "latentkv int8 latent", "latentkv w4a8", "latentkv w4a8 + int8 latent")
        ),
    ]
    assert dict(rows[-1].options) == {"attention_backend": "torch"} and rows[-1].quantization == "w4a8"
    # the estimate follows the weights: w4a8 packs them to about a third of the model dtype's bytes
    assert row_bytes(tiny, rows[2], "1MiB") < row_bytes(tiny, rows[0], "1MiB")


def test_closing_a_system_frees_its_model(tiny):
    system = load_row(Row("latentkv", "auto"), tiny, 256, "1MiB")
    model = weakref.ref(system.model)
    decode.free([system])
    gc.collect()
    assert model() is None


class Counted(LatentKVSystem):
    """Counts the engines alive at once."""

    live = peak = created = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Counted.created += 1
        Counted.live += 1
        Counted.peak = max(Counted.peak, Counted.live)

    def close(self):
        super().close()
        Counted.live -= 1


@pytest.fixture
def counted(monkeypatch):
    monkeypatch.setattr(Counted, "live", 0)
    monkeypatch.setattr(Counted, "peak", 0)
    monkeypatch.setattr(Counted, "created", 0)
    monkeypatch.setattr(decode, "LatentKVSystem", Counted)
    return Counted


def decode_cli(tiny, out) -> list[str]:
    return [
        "bench",
        "decode",
        "--quick",
        "--model",
        tiny,
        "--no-baselines",
        "--weights",
        "none",
        "int4",
        "--kv-cache-dtypes",
        "auto",
        "--contexts",
        "64",
        "--out",
        str(out),
    ]


def test_decode_holds_one_engine_at_a_time_when_they_do_not_fit_together(tiny, tmp_path, monkeypatch, counted):
    rows = [Row("latentkv", "auto"), Row("latentkv w4", "auto", "int4")]
    budget = cache_budget(tiny, 3 * (64 + 2 * 8 + 64))  # --quick: 8 tokens after the 64-token context
    need = [row_bytes(tiny, r, budget) for r in rows]
    room = max(need) + min(need) // 2  # either engine fits, not both
    monkeypatch.setattr(decode, "available_memory", lambda device: int(room / decode.HEADROOM))
    assert main(decode_cli(tiny, tmp_path / "one")) == 0
    data = json.loads((tmp_path / "one" / "decode.json").read_text())
    assert data["engines"] == "one at a time" and (counted.created, counted.peak, counted.live) == (2, 1, 0)
    row = data["results"][0]
    assert set(row["tok_s"]) == {"latentkv", "latentkv w4"} and row["ratio"]["latentkv"] == 1.0
    assert set(row["prefill_tok_s"]) == {"latentkv", "latentkv w4"} and set(data["weight_bytes"]) == set(row["tok_s"])


def test_decode_loads_the_rows_together_when_they_fit(tiny, tmp_path, counted):
    assert main(decode_cli(tiny, tmp_path / "all")) == 0
    data = json.loads((tmp_path / "all" / "decode.json").read_text())
    assert data["engines"] == "together" and (counted.created, counted.peak, counted.live) == (2, 2, 0)


def test_decode_refuses_before_loading_when_one_engine_does_not_fit(tiny, tmp_path, monkeypatch, counted):
    monkeypatch.setattr(decode, "available_memory", lambda device: 2**20)
    with pytest.raises(SystemExit, match="needs about"):
        main(decode_cli(tiny, tmp_path / "none"))
    assert counted.created == 0
