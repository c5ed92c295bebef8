"""A `latentkv bench` subcommand run in --quick mode, read back from the JSON it wrote; a figure's sanity check."""

import json
import math

from latentkv.cli import main


def run_bench(name, tiny, tmp_path, *extra):
    out = tmp_path / name
    # one thread, as every test of the suite runs (a worker per core); `extra` may ask for more
    args = ["bench", name, "--quick", "--model", tiny, "--source", tiny, "--out", str(out), "--threads", "1"]
    assert main([*args, *extra]) == 0
    assert (out / f"{name}.png").stat().st_size > 0
    return json.loads((out / f"{name}.json").read_text())


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0
