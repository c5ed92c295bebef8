"""Stand-in baselines for bench/isolated.py's tests, built in the spawned process by "fake_baseline:Class"."""

import os
import signal


class Steady:
    def __init__(self, name, seconds=0.5):
        self.name, self.seconds, self.prompt = name, seconds, None

    def prepare(self, prompt_ids):
        self.prompt = prompt_ids

    def decode(self, n):
        return self.seconds * len(self.prompt) / n  # proof the call reached this object with its prompt


class SegfaultOnDecode(Steady):
    def decode(self, n):
        print("fake baseline: first eval", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)  # what llama-cpp-python's AMX code does on some CPUs


class FailsToLoad:
    def __init__(self, name):
        raise RuntimeError("fake baseline: no such weights")


class SegfaultOnScore:
    """A llama.cpp scorer (bench/frontier.py LlamaCppScorer's calls) that dies at its first eval."""

    def __init__(self, name, gguf, kind, n_ctx):
        self.name = name

    def top1(self, cases):
        os.kill(os.getpid(), signal.SIGSEGV)
