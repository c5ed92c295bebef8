"""lm-evaluation-harness as a real client: its `local-completions` model scores the README's
tiny task (docs/lm-eval/) through the test server's prompt scoring (echo + logprobs).
Skipped unless lm-eval is installed (`pip install -e ".[lm-eval]"`; not part of `make test`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_helpers import MODEL_NAME

lm_eval = pytest.importorskip("lm_eval")

ROOT = Path(__file__).parents[2]


def test_local_completions_scores_the_readme_task(server, tiny_model_dir, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(ROOT)  # the task's data_files path is relative to the repository root
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model={MODEL_NAME},base_url={server.base_url}/completions,tokenizer={tiny_model_dir},"
        "num_concurrent=1,max_retries=1",
        tasks=["latentkv_capitals"],
        task_manager=TaskManager(include_path=str(ROOT / "docs" / "lm-eval")),
    )
    scores = results["results"]["latentkv_capitals"]
    assert 0.0 <= scores["acc,none"] <= 1.0
    assert results["n-samples"]["latentkv_capitals"]["effective"] == 8
