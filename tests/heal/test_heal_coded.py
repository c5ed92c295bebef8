"""Healing a transform-coded folder (latentkv.cache_format): the student trains on the latent its cache gives
back (convert/simulated.py, straight-through), so what moves is what the folder serves."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from latentkv.cache import transform_code as tc
from latentkv.convert.simulated import simulate
from latentkv.facts import TRANSFORM_CODE
from latentkv.heal import heal
from latentkv.heal.behaviour import student_model
from latentkv.heal.windows import training_windows
from latentkv.model.loader import load_model
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits


@pytest.fixture(scope="module")
def coded(tiny_pair, tmp_path_factory):
    """The tiny native conversion with a 1-3-bit transform code of its latent and rope key in its config."""
    folder = tmp_path_factory.mktemp("coded") / "mla"
    shutil.copytree(tiny_pair[1], folder)
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    model = load_model(folder)
    attn = [layer.self_attn for layer in model.model.layers]
    latent = tuple(tuple((3, 2, 2, 1, 1, 1)[i % 6] for i in range(a.kv_rank)) for a in attn)
    rope = tuple(tuple((3, 2)[i % 2] for i in range(a.dr)) for a in attn)
    cfg["latentkv"].pop("cache_dtype", None)
    cfg["latentkv"]["cache_format"] = tc.TransformCode(latent, rope, 2).to_dict()
    path.write_text(json.dumps(cfg))
    return folder


def healed(heal_settings, converted, out):
    heal(heal_settings(out, converted=str(converted)))
    return out


@torch.inference_mode()
def served_kl(tiny_pair, folder, code) -> float:
    """KL(teacher ‖ the folder's model reading its latent through `code`) on fixed windows of the text."""
    ids = training_windows(AutoTokenizer.from_pretrained(tiny_pair[0]), [str(tiny_pair[3])], 32, 4 * 32, seed=7)
    s = F.log_softmax(simulate(load_model(folder), code).full_logits(ids), -1).flatten(0, 1)
    t = F.log_softmax(source_logits(read_source(tiny_pair[0]), ids), -1).flatten(0, 1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean").item()


def test_the_heal_trains_through_the_codes_and_keeps_the_format(tiny_pair, heal_settings, coded, tmp_path):
    code = tc.folder_code(load_model(coded).config)
    through = healed(heal_settings, coded, tmp_path / "through")
    assert tc.folder_code(load_model(through).config) == code  # served in the same format
    # the same heal of the same weights without the codes in the loop (the folder's plain conversion)
    around = healed(heal_settings, tiny_pair[1], tmp_path / "around")
    before = served_kl(tiny_pair, coded, code)
    after_through, after_around = served_kl(tiny_pair, through, code), served_kl(tiny_pair, around, code)
    assert after_through < 0.9 * before, (before, after_through)
    # measured 0.290 -> 0.194 through the codes, 0.202 around them: the codes' own error healed too
    assert after_through < 0.98 * after_around, (after_through, after_around)


def test_eval_chat_scores_a_coded_student_through_its_codes_once(coded):
    """The heal's student already reads its latent through the codes: `eval chat` scores it over a float cache
    (what the served coded cache gives, within float noise), never through the coded cache as well."""
    code = tc.folder_code(load_model(coded).config)
    student = simulate(load_model(coded), code)
    probe = student_model(student, AutoTokenizer.from_pretrained(coded), coded)
    ids = torch.randint(3, 300, (1, 24), generator=torch.Generator().manual_seed(5))
    assert probe.cache_dtype == TRANSFORM_CODE
    assert torch.equal(probe.logits(ids), student.full_logits(ids, cache_dtype="auto"))
    served = load_model(coded).full_logits(ids, cache_dtype=TRANSFORM_CODE)
    assert (probe.logits(ids) - served).abs().max() <= 1e-4 * served.abs().max()
    answer = probe.greedy([ids[0].tolist()], [3])[0]
    assert 1 <= len(answer) <= 3 and answer[0] == int(served[0, -1].argmax())
