import json
import os
import shutil
import tempfile

import pytest
import torch

from latentkv.bench.random_model import write_random_model
from latentkv.kernels import attention as attention_kernels, build, decode_ops, qlinear, sample as sample_kernel
from latentkv.sources import chat_data
from latentkv.sources.readers import read_source
from tiny import CONFIGS, save_hf_model
from tiny_lm import save_tiny_lm

torch.set_num_threads(1)  # tiny models: a second spinning thread only adds contention
os.environ.setdefault("LATENTKV_THREADS", "1")  # engines (default: all cores) follow the same rule
# The suite never reads or writes the user's cache (conversions, chat answers, hashes): a fresh one per
# run, inherited by the servers and CLIs it starts. The native builds stay where they were (keyed by
# checkout and source), so a run does not recompile them.
os.environ.setdefault("LATENTKV_BUILD_DIR", str(build.build_root()))
SESSION_CACHE = tempfile.mkdtemp(prefix="latentkv-tests-")
os.environ["LATENTKV_CACHE_DIR"] = SESSION_CACHE
# A first run builds the four native extensions side by side before any test needs one (~2 min on
# 2 cores), not one after another as tests first touch each (~4.5 min); the tests start once they are
# in place, so none sees a build in flight.
for thread in build.build_in_background(attention_kernels.EXT, decode_ops.EXT, qlinear.EXT, sample_kernel.EXT):
    thread.join()


THREADS = os.environ["LATENTKV_THREADS"]


@pytest.fixture(autouse=True)
def the_suites_threads_after_each_test():
    """A `latentkv bench` command run in-process sets torch's thread count and LATENTKV_THREADS for the
    whole process (set_threads: --threads, default 2). Put the suite's count back after each test: else
    the worker's later tests ran on two threads each, beside another worker on a 2-core machine."""
    yield
    os.environ["LATENTKV_THREADS"] = THREADS
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture(params=["native", "torch"])
def attention_backend(request, monkeypatch):
    """Run a test through each attention backend (the native one where it builds); "torch" is the
    whole reference path: the model's PyTorch ops instead of the fused native ones (model/fused.py)."""
    if request.param == "native" and not attention_kernels.available():
        pytest.skip(f"native backend not built: {attention_kernels.unavailable_reason()}")
    if request.param == "torch":
        monkeypatch.setattr(decode_ops.EXT, "state", {"module": None, "reason": "the reference path (tests)"})
    return request.param


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """name -> (folder, transformers model) for every tiny config, built once per run."""
    root = tmp_path_factory.mktemp("tiny")
    cache = {}

    def get(name: str):
        if name not in cache:
            folder = root / name
            cache[name] = (folder, save_hf_model(name, folder))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """name -> (folder with weights + tokenizer, transformers model, tokenizer)."""
    root = tmp_path_factory.mktemp("tiny_lm")
    built = {}

    def get(name: str = "v3_dense_qlora", tokenizer: bool = True):
        key = (name, tokenizer)
        if key not in built:
            folder = root / f"{name}{'' if tokenizer else '_notok'}"
            built[key] = (folder, *save_tiny_lm(folder, name, tokenizer))
        return built[key]

    return get


@pytest.fixture(params=sorted(CONFIGS))
def tiny_name(request):
    return request.param


@pytest.fixture(scope="session")
def bundled_source():
    """The bundled SmolLM2 GGUF as a source, its tokenizer loaded once (random-model folders carry it)."""
    source = read_source()
    source.tokenizer()
    return source


@pytest.fixture(scope="session")
def random_checkpoints(tmp_path_factory, bundled_source):
    """shape -> a `latentkv bench random-model` folder of that shape (seed 0; 32 MiB shards, so `mid`
    has several), written once per run."""
    root = tmp_path_factory.mktemp("random")
    cache = {}

    def get(shape: str):
        if shape not in cache:
            cache[shape] = write_random_model(shape, root / shape, seed=0, shard_bytes=32 << 20, source=bundled_source)
        return cache[shape]

    return get


@pytest.fixture
def few_chat_prompts(tmp_path, monkeypatch):
    """Five chat prompts (both splits) instead of the full file, and a fresh user cache: answers
    for a tiny source are generated in seconds."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"id": f"t-{i}", "category": "test", "prompt": p, "split": "heldout" if i % 2 else "calib"}
        for i, p in enumerate(["the quick fox", "one two three", "héllo wörld", "def main():", "one two four"])
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(chat_data, "PROMPTS_FILE", prompts)
    monkeypatch.setenv("LATENTKV_CACHE_DIR", str(tmp_path / "cache"))
    return rows
