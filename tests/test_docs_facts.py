"""What docs/internals.md states as a fact or default equals the code's constant (read from both)."""
import inspect
import re
from dataclasses import fields
from pathlib import Path

from latentkv.attention.prefill import SPAN as PREFILL_SPAN
from latentkv.engine.args import EngineArgs
from latentkv.facts import ATTENTION_BACKEND_DEFAULT, ATTENTION_BACKENDS
from latentkv.kernels import attention, build
from latentkv.model.loader import load_model
from latentkv.settings import Settings

DOCS = Path(__file__).parents[1] / "docs"
INTERNALS = (DOCS / "internals.md").read_text()
KERNELS_CSRC = Path(build.__file__).parent / "csrc"
ENGINE_DEFAULTS = {f.name: f.default for f in fields(EngineArgs)}


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_attention_backend_default_is_the_codes():
    documented = re.search(r'load_model\(path, .*attention_backend="(\w+)"[,)]', INTERNALS).group(1)
    assert documented == ATTENTION_BACKEND_DEFAULT == ENGINE_DEFAULTS["attention_backend"] \
        == Settings().attention_backend
    assert inspect.signature(load_model).parameters["attention_backend"].default == ATTENTION_BACKEND_DEFAULT
    assert f'"{ATTENTION_BACKEND_DEFAULT}" (the default everywhere' in flat(INTERNALS)
    assert set(re.search(r'BACKENDS = \{"native": NativeBackend, "torch": TorchBackend\}', flat(INTERNALS))
               .group(0).split('"')[1::2]) | {"auto"} == set(ATTENTION_BACKENDS)


def test_the_isa_list_is_the_codes():
    forced = re.search(r"LATENTKV_CPU_ISA=([a-z0-9_|]+)", INTERNALS).group(1).split("|")
    assert sorted(forced) == sorted(build.ISAS)
    assert all(f"`{name}`" in INTERNALS or name in INTERNALS for name in build.ISAS)
    modules = [p for p in KERNELS_CSRC.rglob("*.cpp") if "PYBIND11_MODULE" in p.read_text()]  # one per extension
    assert len(modules) == 3
    for cpp in modules:  # each pybind docstring lists the codes it returns
        doc = re.search(r'"instruction sets this CPU runs: ([^"]+)"', cpp.read_text()).group(1)
        highest = int(re.search(r"isas_up_to\((\d)\)", cpp.read_text()).group(1))
        assert [int(c) for c in re.findall(r"(?:^|, )(\d) ", doc)] == list(range(highest + 1)), cpp.name


def test_the_span_limits_are_the_codes():
    job = (KERNELS_CSRC / "attention" / "mla_job.h").read_text()
    span = int(re.search(r"constexpr int64_t SPAN = (\d+);", job).group(1))
    max_spans = int(re.search(r"constexpr int64_t MAX_SPANS = (\d+);", job).group(1))
    assert (span, max_spans) == (attention.DECODE_SPAN, attention.DECODE_MAX_SPANS)
    text = flat(INTERNALS)
    assert f"fixed positions ({span} tokens each, at most {max_spans} per sequence) for contexts up to " \
           f"{span * max_spans:,} tokens" in text
    assert f"a span is ≥ {span} tokens (`DECODE_SPAN`) and a sequence has at most {max_spans}" in text
    assert f"(`SPAN` = {PREFILL_SPAN:,};" in text


def test_the_first_build_time_is_stated_once_and_as_the_code_says():
    assert f"`FIRST_BUILD` = {build.FIRST_BUILD}" in flat(INTERNALS)
    # docs/history/ (dated measurements) is left out: the glob reads docs/*.md only
    sources = [*DOCS.glob("*.md"), DOCS.parent / "README.md", *Path(build.__file__).parents[1].rglob("*.py")]
    for doc in sources:
        for stated in re.findall(r"(?i)first build[^.]{0,60}?(\d+(?:-\d+)? s)\b", doc.read_text()):
            assert stated == build.FIRST_BUILD, doc
