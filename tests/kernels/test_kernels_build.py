"""kernels/build.py: the one build, ISA choice, self-check and fallback of every native extension."""

import warnings

import pytest

from latentkv.kernels import attention, build, decode_ops, qlinear, sample

FAMILIES = [attention, decode_ops, qlinear, sample]


def built(family):
    if not family.available():
        pytest.skip(f"{family.EXT.name} not built: {family.unavailable_reason()}")
    return family.EXT


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.EXT.family)
def test_every_path_this_cpu_runs_passes_the_self_check(family):
    ext = built(family)
    assert ext.state["disabled"] == {}
    assert ext.supported_isas() == [build.isa_name(code) for code in ext.state["runs"]]
    assert build.self_check(ext, ext.state["module"], ext.state["runs"]) == {}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.EXT.family)
def test_a_wrong_path_is_disabled_with_one_warning_and_the_next_lower_serves(family, monkeypatch):
    runs = built(family).state["runs"]
    if len(runs) < 2:
        pytest.skip("this CPU runs only the scalar path")
    wrong, below = build.isa_name(runs[-1]), build.isa_name(runs[-2])
    monkeypatch.delenv("LATENTKV_CPU_ISA", raising=False)
    monkeypatch.setenv("LATENTKV_SELFCHECK_BREAK", f"{family.EXT.family}:{wrong}")
    monkeypatch.setattr(family.EXT, "state", {})  # load again: the self-check runs at load
    with pytest.warns(
        RuntimeWarning,
        match=f"{family.EXT.name}'s {wrong} path disagrees with its scalar path .*; disabled, {below} serves",
    ) as caught:
        assert family.available()
    assert len([w for w in caught if "disagrees" in str(w.message)]) == 1
    assert wrong not in family.EXT.supported_isas() and family.EXT.isa() == build.ISAS[below]
    monkeypatch.setenv("LATENTKV_CPU_ISA", wrong)  # forced: the path below it serves
    assert family.EXT.choose() == below


def test_a_switched_off_extension_is_unavailable_without_a_warning(monkeypatch):
    monkeypatch.setenv("LATENTKV_QLINEAR", "0")
    monkeypatch.setattr(qlinear.EXT, "state", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not qlinear.available()
    assert "LATENTKV_QLINEAR=0" in qlinear.unavailable_reason() and qlinear.EXT.supported_isas() == []


def test_a_forced_isa_above_an_extensions_best_runs_its_best(monkeypatch):
    """An extension whose best path is below the forced one serves its best: checked on the rule
    itself (choose_isa) with avx512 as the best, since every family reaches amx on an AMX CPU."""
    monkeypatch.setenv("LATENTKV_CPU_ISA", "avx512_bf16")
    assert build.choose_isa([0, 1, 2], [0, 1, 2]) == "avx512"
    if "avx512_bf16" in attention.supported_isas():
        assert attention.chosen_isa() == "avx512_bf16"
    monkeypatch.setenv("LATENTKV_CPU_ISA", "neon")
    with pytest.raises(ValueError, match="expected one of"):
        build.choose_isa([0, 1, 2], [0, 1, 2])
