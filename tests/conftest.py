import pytest
import torch

from tiny import CONFIGS, save_hf_model

torch.set_num_threads(1)  # tiny models: a second spinning thread only adds contention


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


@pytest.fixture(params=sorted(CONFIGS))
def tiny_name(request):
    return request.param
