"""Healing on a tiny Llama converted to MLA at a small rank: KL falls, resume is exact,
NaN steps are skipped, the output loads in LLM and (stock) in transformers."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import latentkv.heal.trainer as trainer
from latentkv import LLM, SamplingParams
from latentkv.heal import heal
from latentkv.heal.windows import training_windows
from latentkv.model.loader import load_model
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

STEPS = 20  # heal_settings' (conftest.py)


def run_heal(heal_settings, out, **kwargs):
    return heal(heal_settings(out, **kwargs))


@torch.inference_mode()
def heldout_kl(tiny_pair, model_dir) -> float:
    """KL(teacher ‖ model) on fixed windows of the training text."""
    teacher = read_source(tiny_pair[0])
    ids = training_windows(AutoTokenizer.from_pretrained(tiny_pair[0]), [str(tiny_pair[3])], 32, 4 * 32, seed=7)
    s = F.log_softmax(load_model(model_dir).full_logits(ids), -1).flatten(0, 1)
    t = F.log_softmax(source_logits(teacher, ids), -1).flatten(0, 1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean").item()


def test_kl_falls(tiny_pair, heal_settings, tmp_path):
    result = run_heal(heal_settings, tmp_path / "healed")
    assert result.steps_done == STEPS and result.skipped == 0
    before, after = heldout_kl(tiny_pair, tiny_pair[1]), heldout_kl(tiny_pair, tmp_path / "healed")
    assert after < 0.9 * before, f"KL {before:.4f} -> {after:.4f}"  # deterministic: fixed seeds and data
    assert (tmp_path / "healed" / "loss_curve.png").exists()


def test_resume_reproduces_the_uninterrupted_run(tiny_pair, heal_settings, tmp_path):
    full = run_heal(heal_settings, tmp_path / "full")

    def interrupt(step, loss):
        if step == 10:
            raise KeyboardInterrupt  # killed after the step-10 checkpoint
        return loss

    cfg = heal_settings(tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        heal(cfg, on_loss=interrupt)
    cfg.resume = True
    resumed = heal(cfg)
    assert resumed.steps_done == STEPS
    assert resumed.losses[10:] == pytest.approx(full.losses[10:], rel=1e-5, abs=1e-7)


def test_injected_nan_is_skipped_and_counted(tiny_pair, heal_settings, tmp_path):
    result = heal_with_nans(heal_settings, tmp_path / "nan", {3})
    assert result.skipped == 1 and result.steps_done == STEPS and len(result.losses) == STEPS - 1
    assert all(torch.isfinite(torch.tensor(result.losses)))


def test_too_many_nans_in_a_row_stop_and_keep_the_last_good_checkpoint(tiny_pair, heal_settings, tmp_path):
    result = heal_with_nans(heal_settings, tmp_path / "nan", set(range(12, 20)))
    assert result.stopped.startswith("stopped") and result.skipped == 6
    model = load_model(tmp_path / "nan")  # the step-10 checkpoint
    assert all(torch.isfinite(p).all() for p in model.parameters())


def heal_with_nans(heal_settings, out, bad_steps):
    cfg = heal_settings(out, lr=1e-2)
    return heal(cfg, on_loss=lambda step, loss: loss * float("nan") if step in bad_steps else loss)


def test_healed_outputs_load_in_llm_and_stock_in_transformers(tiny_pair, heal_settings, tmp_path):
    native_out = run_heal(heal_settings, tmp_path / "native", steps=4)
    llm = LLM(model=str(native_out.out), kv_cache_memory="4MiB")
    text = llm.generate(["the quick brown"], SamplingParams(max_tokens=5, temperature=0))[0].outputs[0]
    assert len(text.token_ids) == 5

    _, _, stock, _ = tiny_pair
    stock_out = run_heal(heal_settings, tmp_path / "stock", steps=4, converted=str(stock)).out
    hf = AutoModelForCausalLM.from_pretrained(stock_out, dtype=torch.float32).eval()
    ids = torch.randint(3, 300, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - load_model(stock_out).full_logits(ids)).abs().max().item()
    assert diff <= 1e-4


def test_a_timed_run_resizes_its_schedule_when_steps_slow_down(tiny_pair, heal_settings, tmp_path, monkeypatch):
    """--minutes only: the cosine schedule is re-sized from the measured speed, so a run whose
    steps get slower (a busier machine) still ends its schedule at the deadline."""
    clock = {"now": 0.0, "calls": 0}

    def fake_monotonic():  # each clock read advances 0.5 s, 1.5 s once the machine "gets busy"
        clock["calls"] += 1
        clock["now"] += 0.5 if clock["calls"] < 40 else 1.5
        return clock["now"]

    monkeypatch.setattr(trainer.time, "monotonic", fake_monotonic)
    result = run_heal(heal_settings, tmp_path / "timed", steps=None, minutes=1.0, save_every=1000)
    assert result.stopped == "time budget reached" and result.steps_done > 5
    state = json.loads((tmp_path / "timed" / "training_state" / "state.json").read_text())
    assert state["counters"]["total"] - result.steps_done <= 3, state["counters"]["total"]
