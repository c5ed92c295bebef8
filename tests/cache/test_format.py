"""The cache format (cache/format.py): one object, decided when the cache is made, that the cache's
storage, the accounting and the KV store agree with, and that only the writer turns into stores."""

import ast
import re
from pathlib import Path

import pytest
import torch

import latentkv
from latentkv.cache.accounting import latent_bytes
from latentkv.cache.format import FORMATS, cache_format
from latentkv.cache.latent_cache import LatentCache
from latentkv.facts import CACHE_DTYPES, TRANSFORM_CODE
from latentkv.store.tier import block_rows

ROOT = Path(latentkv.__file__).parent


@pytest.mark.parametrize("name", CACHE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank,rope_dim", [(96, 48), (240, 64), (33, 0)])
def test_bytes_per_token_is_what_the_cache_the_store_and_the_accounting_count(name, dtype, rank, rope_dim):
    fmt = cache_format(name, dtype)
    blocks, block_size = 3, 16
    cache = LatentCache(blocks, block_size, rank, rope_dim, dtype, name)
    assert cache.format is fmt  # decided once: the same object everyone asks
    per_token = fmt.bytes_per_token(rank, rope_dim)
    assert cache.nbytes() == blocks * block_size * per_token
    # the store reads and writes a block as the cache's tensors' rows (store/tier.py block_rows)
    assert sum(rows.shape[1] for _, _, rows in block_rows([cache])[0]) == block_size * per_token
    assert latent_bytes([rank, rank], rope_dim, name, str(dtype).removeprefix("torch.")) == 2 * per_token
    # the cache's tensors are the format's parts, in its order
    assert [(t.dtype, tuple(t.shape)) for t in cache.tensors()] == [
        (p.dtype, (blocks, block_size, *p.shape)) for p in fmt.parts(rank, rope_dim)
    ]


def test_known_sizes():
    """DeepSeek-V2's 512 + 64 per layer in each format (bf16 model)."""
    sizes = {name: cache_format(name, torch.bfloat16).bytes_per_token(512, 64) for name in CACHE_DTYPES}
    assert sizes == {
        "auto": 2 * 576,
        "int8": 512 + 4 + 2 * 64,
        "fp8_e4m3": 512 + 4 + 2 * 64,
        "int8_rope8": 512 + 4 + 64 + 4,
        "fp8_e4m3_rope8": 512 + 4 + 64 + 4,
        "q4_0": 256 + 2 * 16 + 32 + 2 * 2,
    }
    assert cache_format("int8", torch.float32).bytes_per_token(512, 64) == 512 + 4 + 2 * 64  # bf16 rope key


def test_an_unknown_format_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown latent cache format 'int4'.*int8_rope8"):
        cache_format("int4", torch.float32)
    with pytest.raises(ValueError, match="unknown latent cache format"):
        LatentCache(1, 16, 8, 4, torch.float32, "q8")


def test_what_each_format_answers():
    f32, bf16 = torch.float32, torch.bfloat16
    assert not cache_format("auto", bf16).quantized and cache_format("auto", bf16).label == "bfloat16"
    assert cache_format("int8", f32).qmax == 127.0 and cache_format("fp8_e4m3_rope8", f32).qmax == 448.0
    assert cache_format("int8_rope8", f32).rope8 and not cache_format("int8", f32).rope8
    q4 = cache_format("q4_0", f32)
    assert q4.turned_rope and not q4.native_write and q4.qmax == 0.0
    assert all(cache_format(name, f32).native_write for name in FORMATS if name not in ("q4_0", TRANSFORM_CODE))
    coded = cache_format(TRANSFORM_CODE, f32)  # the kind alone: its parts are a layer's code's
    assert coded.coded and coded.quantized and not coded.native_write and not coded.native_read
    assert all(cache_format(name, f32).native_read for name in CACHE_DTYPES)
    with pytest.raises(ValueError, match="per layer"):
        coded.parts(8, 4)


def test_the_storage_names_what_the_tensors_hold():
    """One name per way a layer is stored: formats that store the same tensors share it (a float32 and a
    bf16 model's int8 cache both keep a bf16 rope key), formats that differ do not."""
    storages = {}
    for name in CACHE_DTYPES:
        for dtype in (torch.float32, torch.bfloat16):
            fmt = cache_format(name, dtype)
            storages.setdefault(fmt.storage, set()).add(tuple((p.name, p.dtype) for p in fmt.parts(64, 32)))
    assert all(len(parts) == 1 for parts in storages.values()), storages
    assert len(set().union(*storages.values())) == len(storages)
    assert sorted(storages) == sorted(
        ["kv_float32", "kv_bfloat16", "int8_bfloat16", "int8_int8", "fp8_e4m3_bfloat16", "fp8_e4m3_int8", "q4_0"]
    )


def sources(skip: set[str] = frozenset()) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.rglob("*.py") if str(p.relative_to(ROOT)) not in skip}


def test_one_module_reads_a_format_from_its_name():
    """facts names the formats; only cache/format.py turns a name into what is stored (no other module
    takes facts' Q4 / ROPE8 to decide a layout again)."""
    readers = set()
    for path, text in sources({"facts.py", "cache/format.py"}).items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("facts"):
                if {a.name for a in node.names} & {"Q4", "ROPE8"}:
                    readers.add(path)
    assert readers == set()


def test_one_writer():
    """The latent cache is stored by model/fused.py write_latent alone: it calls the native writer (the one
    the decode plan's step calls too) or the reference layout (attention/paged.py write), and nothing else
    in the package calls either or stores into a cache's tensors."""
    native = {p for p, text in sources().items() if re.search(r"(\]|module)\.write_latent\(", text)}
    assert native == {"model/fused.py", "kernels/decode_ops.py"}  # decode_ops.py: its self-check's probe
    paged_write = r"from \.*(latentkv\.)?attention\.paged import .*\bwrite\b"
    reference = {p for p, text in sources().items() if re.search(paged_write, text)}
    assert reference == {"model/fused.py"}
    stores = {p for p, text in sources().items() if "index_copy_(" in text or "index_put_(" in text}
    assert stores == {"attention/paged.py"}
    csrc = ROOT / "kernels" / "csrc"
    defined = [p.name for p in csrc.rglob("*.cpp") if re.search(r"^void write_latent\(", p.read_text(), re.M)]
    assert defined == ["decode_ops.cpp"]
