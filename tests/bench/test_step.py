"""`latentkv bench step`: the decode step by batch size against the bytes it reads (no timing
assertions: that the measurements exist, and that the experts counted are those the tokens route to)."""

import json
import math
import statistics

from latentkv.cli import main
from latentkv.config import ModelConfig


def test_bench_step_counts_the_experts_each_batch_touches(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints("v2_lite_moe")[0]
    cfg = ModelConfig.from_file(folder / "config.json")
    out = tmp_path / "step"
    args = ["bench", "step", "--model", str(folder), "--weights", "w4a8", "--kv-cache-dtype", "int8"]
    assert main([*args, "--batches", "1", "3", "8", "--context", "20", "--steps", "3", "--out", str(out)]) == 0
    data = json.loads((out / "step.json").read_text())
    assert (out / "step.png").stat().st_size > 0
    rows = {r["batch"]: r for r in data["results"]}
    assert sorted(rows) == [1, 3, 8]
    k, experts = cfg.num_experts_per_tok, cfg.n_routed_experts
    assert rows[1]["experts_touched"] and set(rows[1]["experts_touched"]) == {k}  # one token: its k experts
    for n, r in rows.items():
        assert all(k <= t <= min(experts, n * k) for t in r["experts_touched"])
        assert all(math.isfinite(r[key]) and r[key] > 0 for key in ("step_ms", "floor_ms", "tok_s", "step_over_floor"))
    assert rows[8]["weight_bytes"] >= rows[3]["weight_bytes"] >= rows[1]["weight_bytes"]
    assert rows[1]["x_first"] == 1.0 and rows[1]["ceiling_x_first"] == 1.0
    for r in rows.values():  # each batch's floor is its bytes over the mean of the probes around it
        before, after = r["bandwidth_probes_gbs"]
        assert math.isclose(r["bandwidth_gbs"], (before + after) / 2, rel_tol=1e-12)
        assert math.isclose(
            r["floor_ms"] * r["bandwidth_gbs"] * 1e6, r["weight_bytes"] + r["cache_bytes"], rel_tol=1e-9
        )
    low, high = data["bandwidth_range_gbs"]
    assert low <= data["bandwidth_gbs"] <= high
    assert data["weights"] == "w4a8" and data["kv_cache_dtype"] == "int8" and data["peak_rss_gib"] > 0


def test_bench_step_on_a_dense_model_counts_no_experts(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints("v3_dense_qlora")[0]
    out = tmp_path / "dense"
    assert main(["bench", "step", "--model", str(folder), "--batches", "1", "2", "--context", "12", "--steps", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    data = json.loads((out / "step.json").read_text())
    assert [r["experts_touched"] for r in data["results"]] == [[], []]


def test_bench_step_rounds_measure_every_batch_in_turn_and_report_medians(tiny_checkpoints, tmp_path):
    folder = tiny_checkpoints("v3_dense_qlora")[0]
    out = tmp_path / "rounds"
    assert main(["bench", "step", "--model", str(folder), "--batches", "1", "2", "--context", "12", "--steps", "2",
                 "--rounds", "2", "--out", str(out)]) == 0  # fmt: skip
    data = json.loads((out / "step.json").read_text())
    assert data["rounds"] == 2
    for r in data["results"]:
        assert len(r["round_step_ms"]) == 2 and len(r["bandwidth_probes_gbs"]) == 4  # probed around each round
        assert math.isclose(r["step_ms"], statistics.median(r["round_step_ms"]), rel_tol=1e-12)
        assert math.isclose(r["tok_s"], r["batch"] / r["step_ms"] * 1e3, rel_tol=1e-12)
    assert data["results"][0]["x_first"] == 1.0  # each round's first batch against itself


def test_bench_step_refuses_sizes_below_one(tiny_checkpoints, capsys):
    folder = str(tiny_checkpoints("v3_dense_qlora")[0])
    for bad in (["--rounds", "0"], ["--steps", "0"], ["--context", "0"], ["--batches", "1", "0"]):
        assert main(["bench", "step", "--model", folder, *bad]) == 2
        assert "at least 1" in capsys.readouterr().err
