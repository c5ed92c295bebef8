"""kernels/build.py: the one build, the named capabilities and paths, their self-check and fallback of
every native extension."""

import os
import re
import time
import warnings
from pathlib import Path

import pytest

from latentkv.kernels import attention, build, decode_ops, qlinear, sample
from latentkv.kernels.build import CAPS, Capabilities

FAMILIES = [attention, decode_ops, qlinear, sample]
CSRC = Path(build.__file__).parent / "csrc"
ALL = Capabilities.of(CAPS)


def built(family):
    if not family.available():
        pytest.skip(f"{family.EXT.name} not built: {family.unavailable_reason()}")
    return family.EXT


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.EXT.family)
def test_every_path_this_cpu_runs_passes_the_self_check(family):
    ext = built(family)
    assert ext.state["disabled"] == {}
    assert (
        ext.supported_isas()
        == ext.state["runs"]
        == [p for p, needs in ext.state["paths"].items() if needs <= ext.state["cpu"]]
    )
    assert build.self_check(ext, ext.state["module"], ext.state["paths"], ext.state["runs"]) == {}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.EXT.family)
def test_each_path_is_named_by_the_capability_it_adds_and_needs_a_set_of_names(family):
    ext = built(family)
    module = ext.state["module"]
    assert dict(module.capabilities()) == {name: 1 << i for i, name in enumerate(CAPS)}  # cpu_isa.h = build.CAPS
    paths = ext.state["paths"]
    assert list(paths)[0] == "scalar" and paths["scalar"] == build.NONE
    for path, needs in list(paths.items())[1:]:
        assert path in CAPS and path in needs.names, path
    assert ext.state["cpu"] == Capabilities.of_mask(module.cpu_capabilities())


def test_no_kernel_path_checks_a_rank():
    """Every path is chosen by the names it needs (`has(caps, NEEDS_...)`), never by comparing an ISA
    number: no `isa >= 2`, no code table, in the C++ or in the Python that calls it."""
    rank = re.compile(r"\b(isa|caps)\w*\s*(>=|<=|>|<|==|!=)\s*\d|isa_supported|isas_up_to|has_amx_int8|has_avx512_vnni")
    offenders = [
        f"{path.relative_to(CSRC)}:{n}: {line.strip()}"
        for path in sorted(CSRC.rglob("*"))
        if path.suffix in (".h", ".cpp")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if rank.search(line.split("//")[0])
    ]
    assert offenders == []
    python = Path(build.__file__).parents[2]  # latentkv/ and scripts/
    codes = re.compile(r"\bISAS\b|\.isa\(\)|state\[\"isa\"\]|>= ?4\b.*isa|isa.*>= ?\d")
    offenders = [
        f"{path.relative_to(python)}:{n}"
        for path in sorted((python / "latentkv").rglob("*.py")) + sorted((python / "scripts").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if codes.search(line.split("#")[0])
    ]
    assert offenders == []


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.EXT.family)
def test_a_wrong_path_is_disabled_with_one_warning_and_the_best_left_serves(family, monkeypatch):
    runs = built(family).state["runs"]
    if len(runs) < 2:
        pytest.skip("this CPU runs only the scalar path")
    wrong = runs[-1]
    below = build.best_path(family.EXT.state["paths"], family.EXT.state["cpu"] - Capabilities.of([wrong]))
    monkeypatch.delenv("LATENTKV_CPU_ISA", raising=False)
    monkeypatch.setenv("LATENTKV_SELFCHECK_BREAK", f"{family.EXT.family}:{wrong}")
    monkeypatch.setattr(family.EXT, "state", {})  # load again: the self-check runs at load
    with pytest.warns(
        RuntimeWarning,
        match=f"{family.EXT.name}'s {wrong} path disagrees with its scalar path .*; disabled, {below} serves",
    ) as caught:
        assert family.available()
    assert len([w for w in caught if "disagrees" in str(w.message)]) == 1
    assert wrong not in family.EXT.supported_isas() and wrong not in family.EXT.caps.names
    assert family.EXT.choose() == below and not family.EXT.serves(wrong)


def test_the_paths_built_on_a_disabled_one_leave_with_it(monkeypatch):
    """qlinear's avx512 path wrong: its vnni, bf16 and AMX paths need avx512 too, so avx2 serves."""
    if "avx512" not in built(qlinear).state["runs"]:
        pytest.skip("this CPU has no avx512")
    monkeypatch.delenv("LATENTKV_CPU_ISA", raising=False)
    monkeypatch.setenv("LATENTKV_SELFCHECK_BREAK", "qlinear:avx512")
    monkeypatch.setattr(qlinear.EXT, "state", {})
    with pytest.warns(RuntimeWarning, match="qlinear's avx512 path disagrees .*; disabled, avx2 serves"):
        assert qlinear.available()
    assert qlinear.EXT.supported_isas() == ["scalar", "avx2"] and qlinear.EXT.choose() == "avx2"
    assert qlinear.dot_path() == "avx2" and not qlinear.runs_amx()


def test_a_switched_off_extension_is_unavailable_without_a_warning(monkeypatch):
    monkeypatch.setenv("LATENTKV_QLINEAR", "0")
    monkeypatch.setattr(qlinear.EXT, "state", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not qlinear.available()
    assert "LATENTKV_QLINEAR=0" in qlinear.unavailable_reason() and qlinear.EXT.supported_isas() == []


@pytest.mark.parametrize(
    "forced,cpu,want",
    [
        (None, CAPS, CAPS),
        ("scalar", CAPS, ()),
        ("avx2", CAPS, ("avx2",)),
        ("avx512", CAPS, ("avx2", "avx512", "avx512_vnni")),
        ("avx512", ("avx2", "avx512"), ("avx2", "avx512")),  # Skylake: no avx512_vnni
        ("avx512_bf16", CAPS, ("avx2", "avx512", "avx512_vnni", "avx512_bf16")),
        ("amx", CAPS, CAPS),
        (
            "amx",
            ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_bf16"),
            ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx_bf16"),
        ),
        ("avx2,avx512,avx512_bf16", CAPS, ("avx2", "avx512", "avx512_bf16")),  # names: any set, no order
    ],
)
def test_latentkv_cpu_isa_maps_a_profile_or_names_to_capabilities(forced, cpu, want, monkeypatch):
    if forced is None:
        monkeypatch.delenv("LATENTKV_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("LATENTKV_CPU_ISA", forced)
    assert build.allowed_caps(Capabilities.of(cpu)) == Capabilities.of(want)


def test_forcing_what_the_cpu_lacks_or_no_name_knows_is_refused(monkeypatch):
    monkeypatch.setenv("LATENTKV_CPU_ISA", "neon")
    with pytest.raises(ValueError, match="LATENTKV_CPU_ISA='neon': expected one of"):
        build.allowed_caps(ALL)
    monkeypatch.setenv("LATENTKV_CPU_ISA", "amx")
    with pytest.raises(
        ValueError, match=r"'amx' needs avx512_bf16,amx_bf16, which this CPU lacks \(it has avx2,avx512\)"
    ):
        build.allowed_caps(Capabilities.of(["avx2", "avx512"]))
    monkeypatch.setenv("LATENTKV_CPU_ISA", "avx2,amx_int8")
    with pytest.raises(ValueError, match="needs amx_int8"):
        build.allowed_caps(Capabilities.of(["avx2"]))


def test_a_forced_set_serves_each_family_its_best_path_under_it(monkeypatch):
    """Chosen once, at load: every family then runs the best of its paths the set allows, whatever
    order its paths would have: qlinear under avx2 + avx512 + avx512_bf16 (no vnni) serves bf16 dot
    products while its integer-dot linears run AVX2's; the sampler under amx runs its avx512 rows."""
    for family in (qlinear, sample):
        built(family)
        monkeypatch.setattr(family.EXT, "state", {})
    cpu = Capabilities.of_mask(qlinear.extension().cpu_capabilities())
    if Capabilities.of(["avx2", "avx512", "avx512_bf16"]) <= cpu:
        monkeypatch.setattr(qlinear.EXT, "state", {})
        monkeypatch.setenv("LATENTKV_CPU_ISA", "avx2,avx512,avx512_bf16")
        assert qlinear.EXT.choose() == "avx512_bf16" and qlinear.dot_path() == "avx2" and not qlinear.runs_amx()
    if Capabilities.of(["avx2", "avx512", "avx512_bf16", "amx_bf16"]) <= cpu:
        monkeypatch.setenv("LATENTKV_CPU_ISA", "amx")
        assert sample.EXT.choose() == "avx512" and sample.EXT.caps == cpu
    monkeypatch.setattr(sample.EXT, "state", {})
    monkeypatch.setenv("LATENTKV_CPU_ISA", "scalar")
    assert sample.EXT.choose() == "scalar" and sample.EXT.caps == build.NONE


@pytest.mark.parametrize("family", ["attention", "decode_ops", "qlinear", "sample"])
def test_a_family_compiles_each_isa_in_a_unit_of_its_own(family):
    """The entries file (the one that defines the module) compiles no ISA's loops: every `#pragma GCC
    target` sits in a <family>_<isa>.cpp unit, which hands its loops over as function pointers."""
    units = sorted((CSRC / family).glob("*.cpp"))
    entries = [unit for unit in units if "PYBIND11_MODULE" in unit.read_text()]
    assert len(entries) == 1 and "#pragma GCC target" not in entries[0].read_text()
    targeted = [unit.name for unit in units if "#pragma GCC target" in unit.read_text()]
    assert targeted and all(name.startswith(f"{family}_") for name in targeted), targeted


def test_a_lock_left_by_a_killed_build_is_removed_and_a_live_one_is_waited_for_with_a_message(tmp_path, capsys):
    lock = tmp_path / "lock"
    lock.touch()
    build.check_build_lock(tmp_path, "latentkv_x")  # a build running now: wait for it, and say so
    assert lock.exists() and "waiting for another build of latentkv_x" in capsys.readouterr().err
    old = time.time() - build.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    build.check_build_lock(tmp_path, "latentkv_x")
    assert not lock.exists() and "did not finish" in capsys.readouterr().err
    build.check_build_lock(tmp_path, "latentkv_x")  # no lock: nothing to say
    assert capsys.readouterr().err == ""
