import pytest

from latentkv.sizes import parse_memory


def test_memory_sizes():
    assert parse_memory("2GiB") == 2 * 2**30 and parse_memory("512 MiB") == 512 * 2**20
    assert parse_memory("1.5GB") == 1_500_000_000 and parse_memory(4096) == 4096 and parse_memory("100") == 100
    for bad in ("lots", "-1GiB", 0, "2 parsecs", True):
        with pytest.raises(ValueError):
            parse_memory(bad)
