"""convert/api.py: what a conversion prints where."""

from __future__ import annotations

import time

from latentkv.convert.api import step


def test_stage_lines_go_to_stderr_so_stdout_carries_only_results(capsys):
    """A script reads the converted folder's path from stdout (docs/results/serving.sh): a conversion on
    first use must not print its stage lines there."""
    step(1, "reading the source", time.perf_counter())
    out, err = capsys.readouterr()
    assert out == ""
    assert "latentkv convert [1/5] reading the source" in err
