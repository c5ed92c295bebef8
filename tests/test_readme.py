"""The README's demo question gets the README's answer from the default conversion of the real
bundled model (greedy, float32 weights and latent cache).

One conversion, by the server's own path (`resolve_model(None)`), into the test session's cache
(tests/conftest.py: never the user's); `make test-slow` runs it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from latentkv.llm import LLM
from latentkv.resolve import resolve_model
from latentkv.sampling import SamplingParams

README = Path(__file__).parents[1] / "README.md"
pytestmark = pytest.mark.slow  # the default conversion of the real bundled model (minutes, in a fresh cache)


def readme_demo() -> tuple[str, str]:
    """(question, answer) of the README's chat example."""
    text = README.read_text()
    question = re.search(r'"role": "user", "content": "([^"]+)"', text).group(1)
    answer = re.search(r"^answers `(.+?)`", text, re.M)
    assert answer, "the README shows the demo's answer on a line starting: answers `...`"
    return question, answer.group(1)


def test_the_default_conversion_answers_the_readme_question():
    question, answer = readme_demo()
    llm = LLM(str(resolve_model(None).path), dtype="float32", kv_cache_dtype="auto", max_model_len=256)
    out = llm.chat([{"role": "user", "content": question}], SamplingParams(temperature=0.0, max_tokens=32),
                   use_tqdm=False)
    assert out[0].outputs[0].text.strip().startswith(answer)   # the README shows its beginning
