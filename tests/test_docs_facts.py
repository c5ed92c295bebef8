"""What the docs state as a fact, list, count or default equals the code's (read from both); the results
pages are what the raw output gives; no work-session numbering; docs/ stays small."""

import importlib
import inspect
import re
from dataclasses import fields
from pathlib import Path

from latentkv import llm
from latentkv.attention import BACKENDS
from latentkv.attention.prefill import SPAN as PREFILL_SPAN
from latentkv.engine.args import EngineArgs
from latentkv.facts import ATTENTION_BACKEND_DEFAULT, ATTENTION_BACKENDS, CACHE_DTYPES, ENGINE_CACHE_DTYPES
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
    assert (
        documented == ATTENTION_BACKEND_DEFAULT == ENGINE_DEFAULTS["attention_backend"] == Settings().attention_backend
    )
    assert inspect.signature(load_model).parameters["attention_backend"].default == ATTENTION_BACKEND_DEFAULT
    assert f'"{ATTENTION_BACKEND_DEFAULT}" (the default everywhere' in flat(INTERNALS)
    assert set(
        re.search(r'BACKENDS = \{"native": NativeBackend, "torch": TorchBackend\}', flat(INTERNALS))
        .group(0)
        .split('"')[1::2]
    ) | {"auto"} == set(ATTENTION_BACKENDS)


def test_the_isa_names_are_the_codes():
    forced = re.search(r"LATENTKV_CPU_ISA=([a-z0-9_|]+)", INTERNALS).group(1).split("|")
    assert sorted(forced) == sorted(build.PROFILES)
    assert all(f"`{name}`" in INTERNALS for name in build.CAPS)
    modules = [p for p in KERNELS_CSRC.rglob("*.cpp") if "PYBIND11_MODULE" in p.read_text()]  # one per extension
    families = [p for p in KERNELS_CSRC.parent.glob("*.py") if "= Extension(" in p.read_text()]
    assert len(modules) == len(families) >= 4
    for cpp in modules:  # each module tells build.py its paths the one way (common/isa_paths.h)
        assert "def_isa_paths(m, PATHS);" in cpp.read_text(), cpp.name
    header = (KERNELS_CSRC / "common" / "cpu_isa.h").read_text()
    names = re.search(r"CAP_NAMES\[\] = \{(.*?)\};", header, re.S).group(1)
    assert re.findall(r'\{"(\w+)"', names) == list(build.CAPS)


def test_the_span_limits_are_the_codes():
    job = (KERNELS_CSRC / "attention" / "mla_job.h").read_text()
    span = int(re.search(r"constexpr int64_t SPAN = (\d+);", job).group(1))
    max_spans = int(re.search(r"constexpr int64_t MAX_SPANS = (\d+);", job).group(1))
    assert (span, max_spans) == (attention.DECODE_SPAN, attention.DECODE_MAX_SPANS)
    text = flat(INTERNALS)
    assert (
        f"fixed positions ({span} tokens each, at most {max_spans} per sequence) for contexts up to "
        f"{span * max_spans:,} tokens" in text
    )
    assert f"a span is ≥ {span} tokens (`DECODE_SPAN`) and a sequence has at most {max_spans}" in text
    assert f"(`SPAN` = {PREFILL_SPAN:,};" in text


def test_the_first_build_time_is_stated_once_and_as_the_code_says():
    assert f"`FIRST_BUILD` = {build.FIRST_BUILD}" in flat(INTERNALS)
    # docs/history/ (dated measurements) is left out: the glob reads docs/*.md only
    sources = [*DOCS.glob("*.md"), DOCS.parent / "README.md", *Path(build.__file__).parents[1].rglob("*.py")]
    for doc in sources:
        for stated in re.findall(r"(?i)first build[^.]{0,60}?(\d+(?:-\d+)? s)\b", doc.read_text()):
            assert stated == build.FIRST_BUILD, doc


# --- lists, counts and names the docs state, read from the code; and no work-session numbering ---

ROOT = DOCS.parent
PACKAGE = Path(build.__file__).parents[1]
DESIGN = (DOCS / "design.md").read_text()


def quoted_choices(text: str) -> list[str]:
    """`"a"|"b" | "c"` -> [a, b, c]: the values of a list written with bars."""
    return re.findall(r'"(\w+)"', text)


def test_the_cache_dtypes_in_the_docstrings_and_readme_are_facts_tuples():

    docstring = re.search(r'kv_cache_dtype=((?:"\w+"\|?)+)', flat(llm.LLM.__doc__)).group(1)
    assert quoted_choices(docstring) == list(ENGINE_CACHE_DTYPES)
    source = inspect.getsource(EngineArgs)
    comment = re.search(r'kv_cache_dtype: str = "auto" +#(.*\n(?: +#.*\n)*)', source).group(1)
    assert quoted_choices(re.sub(r"\(.*?\)", "", comment)) == list(ENGINE_CACHE_DTYPES)
    readme = (ROOT / "README.md").read_text()
    lists = re.findall(r"kv_cache_dtype\W+.*?# latent cache: ([\w |]+)", readme)
    assert len(lists) == 2, lists  # the TOML settings and LLM(...)
    for written in lists:
        assert [w.strip() for w in written.split("|")] == list(CACHE_DTYPES)


def test_the_decode_plan_variant_count_is_the_tests():
    plan_tests = (ROOT / "tests" / "model" / "test_decode_plan.py").read_text()
    block = re.search(
        r'parametrize\(\s*"name,dtype,weights,cache_dtype,latent_norm,bias",\s*\[(.*?)\n\s*\],?\s*\)', plan_tests, re.S
    )
    variants = re.findall(r'^\s+\(\s*"(\w+)",', block.group(1), re.M)
    words = dict(
        enumerate(
            "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
            "fifteen sixteen seventeen eighteen nineteen twenty".split()
        )
    )
    moe = sum("moe" in v for v in variants)
    assert f"{words[len(variants)]} model / weight / cache variants, {words[moe]} of them MoE" in flat(INTERNALS)


def test_the_backends_named_in_the_docs_are_the_codes():

    written = re.search(r"BACKENDS = \{(.*?)\}", DESIGN).group(1)
    assert set(re.findall(r'"(\w+)"', written)) == set(BACKENDS)
    for page in (DESIGN, INTERNALS):
        assert not re.search(r"(?i)\bGPU kernels? (plug|replace)", page)  # no GPU backend exists


def test_the_layer_members_the_backend_calls_are_all_documented():
    used = set()
    for path in (PACKAGE / "attention").glob("*.py"):
        used |= set(re.findall(r"\blayer\.(\w+)", path.read_text()))
    section = INTERNALS.split("## Attention backends")[1].split("\n## ")[0]
    first = section.split("What the attention package")[1].split("A backend implements")[0]
    assert set(re.findall(r"`layer\.(\w+)", first)) == used


def test_the_module_lists_name_files_that_exist():
    row = re.search(r"^\| `cache/` \|(.*)$", DESIGN, re.M).group(1)
    assert set(re.findall(r"`(\w+\.py)`", row)) == {p.name for p in (PACKAGE / "cache").glob("*.py")} - {"__init__.py"}
    for path in PACKAGE.rglob("*.py"):  # a module's docstring names sibling files that exist
        doc = re.match(r'\s*(?:#.*\n)*\s*"""(.*?)"""', path.read_text(), re.S)
        for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", doc.group(1) if doc else ""):
            assert any(PACKAGE.rglob(name)) or (ROOT / "scripts" / name).exists(), f"{path}: {name}"


def test_no_work_session_numbering_in_the_repository():
    pages = [
        ROOT / "README.md",
        *DOCS.rglob("*.md"),
        *DOCS.rglob("*.sh"),
        *DOCS.rglob("*.py"),
        *(ROOT / "scripts").glob("*"),
        *PACKAGE.rglob("*.py"),
    ]
    for page in pages:
        text = page.read_text()
        assert not re.search(r"(?i)\bsessions?\s+\d|\bsession's\b|\b(this|previous|that|a) session\b", text), page
        assert not re.search(r"\b\d{4}-\d\d-\d\d \(\d+\)", text), page  # a date with a run number
    assert not [p for p in DOCS.rglob("*") if re.search(r"-s\d+[a-z]?$", p.name)]  # folders named by session


def test_the_results_pages_are_what_the_raw_output_gives(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the scripts import each other as `python scripts/x.py` does
    report = importlib.import_module("bench_report")
    assert report.main(["--check"]) == 0, "run: python scripts/bench_report.py"
    for run in report.runs():
        assert {"Date", "Commit", "CPU", "Flags"} <= set(run.facts), run.kind
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", run.facts["Date"]) and re.fullmatch(
            r"[0-9a-f]{7,40}", run.facts["Commit"]
        )
        assert "—" not in [v for k, v in report.headline(run).items() if "vLLM" not in k], run.kind


def test_a_printed_table_ends_before_what_gnu_time_appends(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    results = importlib.import_module("bench_results")
    rows = "    1     52.2\n   32      204\n"
    text = "title\nbatch  step ms\n-----  -------\n" + rows + "\tMaximum resident set size (kbytes): 1\n"
    (table,) = results.tables(text)
    assert table.rows == [["1", "52.2"], ["32", "204"]]


def test_docs_stay_small():
    size = sum(p.stat().st_size for p in DOCS.rglob("*") if p.is_file())
    assert size < 2 * 2**20, f"docs/ holds {size / 2**20:.1f} MiB: dated runs belong in git history"
