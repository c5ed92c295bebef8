"""`eval ppl --domains`: one table, a column per domain, ratios to the first model."""

from __future__ import annotations

import json

import pytest
from tiny_lm import save_tiny_lm

from latentkv import cli
from latentkv.eval.domains import DOMAINS, PROSE_FILE, code_documents, domain_perplexity, format_domain_table
from latentkv.sources.corpus import is_heldout


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("domains")
    save_tiny_lm(root / "a", "v2_dense")
    save_tiny_lm(root / "b", "v3_dense_qlora")
    return str(root / "a"), str(root / "b")


def test_domain_texts_exist_offline_and_code_is_held_out():
    assert PROSE_FILE.is_file() and "Apache License" in PROSE_FILE.read_text()
    docs = code_documents()
    assert docs and all(is_heldout(name) for name, _ in docs) and any("def " in text for _, text in docs)
    assert all(len(DOMAINS[d]()) > 10_000 for d in DOMAINS)


def test_one_row_per_model_and_ratios_to_the_first(two_models):
    r = domain_perplexity(list(two_models), ctx=32, max_tokens=64)
    assert r["domains"] == list(DOMAINS) and [m["model"] for m in r["models"]] == list(two_models)
    for m in r["models"]:
        assert set(m["ppl"]) == set(DOMAINS) and all(t == 2 * 31 for t in m["tokens"].values())
    assert r["models"][0]["ppl"] != r["models"][1]["ppl"]
    table = format_domain_table(r)
    first, second = table.splitlines()[2:4]
    assert first.endswith("| 1.000 | 1.000 | 1.000 |")
    ratio = r["models"][1]["ppl"]["prose"] / r["models"][0]["ppl"]["prose"]
    assert f"{ratio:.3f}" in second
    with pytest.raises(ValueError, match="unknown domain"):
        domain_perplexity(list(two_models), ["poetry"])


def test_cli_domains_table_and_json(two_models, capsys):
    assert (
        cli.main(["eval", "ppl", *two_models, "--domains", "prose", "code", "--ctx", "32", "--max-tokens", "64"]) == 0
    )
    out = capsys.readouterr().out
    assert "| model | prose | code | prose × | code × |" in out
    assert cli.main(["eval", "ppl", two_models[0], "--domains", "--ctx", "32", "--max-tokens", "32", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["domains"] == list(DOMAINS) and len(r["models"]) == 1
    assert cli.main(["eval", "ppl", *two_models]) == 2
    assert "need --domains" in capsys.readouterr().err
