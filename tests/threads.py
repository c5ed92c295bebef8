"""torch_threads(n): run a block on n torch threads, then restore the count (the batch-invariance
tests compare a kernel's bits on 1 and 2 threads)."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
