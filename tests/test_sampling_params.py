"""`SamplingParams` (latentkv/sampling_params.py): bad values are refused, shorthands normalised."""

import pytest

from latentkv.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(min_p=2),
        dict(max_tokens=0),
        dict(min_tokens=5, max_tokens=2),
        dict(n=0),
        dict(repetition_penalty=0),
        dict(presence_penalty=3),
        dict(logprobs=-1),
        dict(stop=[""]),
    ],
)
def test_invalid_params_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_stop_normalised():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(top_k=-1).top_k == 0
