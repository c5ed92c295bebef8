"""Model resolution shared by `serve`, `chat` and `generate`.

MODEL may be
- a latentkv or DeepSeek-V2/V3 folder (config.json `model_type` deepseek_v2/v3): used as is;
- a Llama-family GGUF file or Hugging Face folder: converted to MLA with the converter's
  default settings, once, and cached under the user cache dir keyed by the source's
  content hash and those settings (so the next start loads the cached folder);
- nothing: the bundled SmolLM2-135M-Instruct GGUF, converted and cached the same way.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import gguf

from latentkv.convert.api import DEFAULTS, convert
from latentkv.facts import MLA_MODEL_TYPES, SOURCE_MODEL_TYPES
from latentkv.sources.readers import default_gguf_path
from latentkv.user_cache import cache_root, content_hash

CACHE_FORMAT = 1  # bump when the cache layout or provenance file changes
# Held-out tokens of the perplexity check on a start's automatic conversion: half the converter's
# default (4096), ~9 of the ~18 s that check took on the first start of the bundled model (2 cores),
# which must stay under two minutes; the weights do not depend on it.
FIRST_START_EVAL_TOKENS = 2048


class ResolveError(ValueError):
    """MODEL names nothing we can serve; the message says what was found."""


@dataclass
class SourceGeometry:
    """The shape of the original model's KV cache: 2 · kv_heads · head_dim per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass
class ResolvedModel:
    path: Path  # the MLA folder the engine loads
    name: str  # default served model name
    source: Path | None = None  # the Llama-family source, when converted
    original: SourceGeometry | None = None  # its KV geometry, for the banner
    from_cache: bool = False  # a converted folder reused from the cache


def resolve_model(model: str | Path | None, convert_fn=None, log=None) -> ResolvedModel:
    """Find or build the MLA folder for MODEL (see the module docstring)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if model is None:
        return convert_cached(default_gguf_path(), convert_fn, log, name="SmolLM2-135M-Instruct")
    path = Path(model).expanduser()
    if not path.exists():
        raise ResolveError(f"model not found: {path} (give a folder, a .gguf file, or nothing for the bundled SmolLM2)")
    kind = classify(path)
    if kind == "mla":
        _, source = recorded_source(path)
        geometry = source_geometry(source) if source else None
        return ResolvedModel(path=path, name=path.resolve().name, source=source, original=geometry)
    return convert_cached(path, convert_fn, log)


def classify(path: Path) -> str:
    """ "mla" for a DeepSeek/latentkv folder, "llama" for a convertible source."""
    if path.is_file():
        if path.suffix == ".gguf":
            return "llama"
        raise ResolveError(f"{path}: a model file must be a .gguf; otherwise give a model folder")
    config = path / "config.json"
    if not config.is_file():
        raise ResolveError(f"{path}: no config.json; a model folder holds config.json and *.safetensors")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type in MLA_MODEL_TYPES:
        return "mla"
    if model_type in SOURCE_MODEL_TYPES:
        return "llama"
    raise ResolveError(
        f"{path}: model_type {model_type!r} is neither MLA {MLA_MODEL_TYPES} "
        f"nor a Llama-family source we convert {SOURCE_MODEL_TYPES}"
    )


# -- the conversion cache --------------------------------------------------------------
def convert_cached(source: Path, convert_fn, log, name: str | None = None) -> ResolvedModel:
    """Convert `source` with default settings unless the cache already holds it."""
    convert_fn = convert_fn or default_convert
    key = cache_key(source, convert_fn)
    folder = cache_root() / "converted" / key
    name = name or source.resolve().name.removesuffix(".gguf")
    if (folder / "latentkv-source.json").is_file():
        provenance = json.loads((folder / "latentkv-source.json").read_text())
        geometry = SourceGeometry(**provenance["geometry"]) if provenance.get("geometry") else None
        log(f"latentkv: using the converted model cached at {folder}")
        return ResolvedModel(path=folder, name=name, source=source, original=geometry, from_cache=True)
    log(f"latentkv: converting {source} to MLA (default settings; once, cached at {folder})")
    started = time.perf_counter()
    tmp = folder.with_name(f"{key}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        convert_fn(source=source, out=tmp)
        geometry = source_geometry(source)
        provenance = {
            "source": str(source),
            "key": key,
            "geometry": asdict(geometry) if geometry else None,
            "seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / "latentkv-source.json").write_text(json.dumps(provenance, indent=2))
        if folder.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"latentkv: converted in {time.perf_counter() - started:.1f} s")
    return ResolvedModel(path=folder, name=name, source=source, original=geometry, from_cache=False)


def default_convert(source: Path, out: Path) -> Path:
    """The conversion a start runs for the user, who waits for it: the converter's defaults with a
    shorter perplexity check (FIRST_START_EVAL_TOKENS), `latentkv eval ppl` measures more."""
    return convert(source=source, out=out, options=replace(DEFAULTS, eval_tokens=FIRST_START_EVAL_TOKENS))


def cache_key(source: Path, convert_fn) -> str:
    """Hash of the source's content, the converter's default settings and the cache format."""
    settings = {"format": CACHE_FORMAT, "converter": converter_defaults(convert_fn), "version": package_version()}
    digest = hashlib.sha256(content_hash(source).encode())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def converter_defaults(convert_fn) -> dict:
    """What "default settings" means for the conversion function: its keyword defaults
    and its module's DEFAULT_* constants (defaults resolved inside the function)."""
    fn = convert if convert_fn is default_convert else convert_fn  # its signature holds the defaults
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = []
    settings = {
        p.name: p.default
        for p in params
        if p.default is not inspect.Parameter.empty and p.name not in ("source", "out")
    }
    module = inspect.getmodule(fn)
    for name, value in sorted(vars(module).items() if module else []):
        if name.startswith("DEFAULT_") and isinstance(value, (int, float, str, bool)):
            settings[name] = value
    return settings


def package_version() -> str:
    """latentkv's version: a new release converts again (a cleared cache dir does too)."""
    try:
        return version("latentkv")
    except PackageNotFoundError:
        return "unknown"


# -- the original model's KV geometry (for the banner) ------------------------------------
def recorded_source(folder: Path) -> tuple[bool, Path | None]:
    """(whether the MLA `folder` is a conversion of a source model, the source it recorded where that
    file still is): the conversion cache's latentkv-source.json, or the converter's record in
    config.json. The banner compares with that source's cache (without it, only with MHA of the
    latent's shape: a GQA source's cache is smaller); bench serve runs vLLM on it."""
    provenance = folder / "latentkv-source.json"
    record = (json.loads((folder / "config.json").read_text()).get("latentkv") or {}).get("source")
    paths = ([json.loads(provenance.read_text()).get("source")] if provenance.exists() else []) + (
        [record.get("path")] if isinstance(record, dict) else []
    )
    found = next((Path(p) for p in paths if p and Path(p).exists()), None)
    return provenance.exists() or record is not None, found


def source_geometry(source: Path) -> SourceGeometry | None:
    """Layers, KV heads and head dim of a Llama-family source, read from its metadata."""
    try:
        if source.is_file():
            return gguf_geometry(source)
        cfg = json.loads((source / "config.json").read_text())
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        return SourceGeometry(cfg["num_hidden_layers"], cfg.get("num_key_value_heads") or heads, head_dim)
    except (OSError, KeyError, ValueError, TypeError):
        return None


def gguf_geometry(path: Path) -> SourceGeometry:
    reader = gguf.GGUFReader(str(path))

    def field(key):
        f = reader.fields.get(key)
        if f is None:
            raise KeyError(key)
        return f.contents()

    arch = field("general.architecture")
    heads = int(field(f"{arch}.attention.head_count"))
    try:
        head_dim = int(field(f"{arch}.attention.key_length"))
    except KeyError:
        head_dim = int(field(f"{arch}.embedding_length")) // heads
    try:
        kv_heads = int(field(f"{arch}.attention.head_count_kv"))
    except KeyError:
        kv_heads = heads
    return SourceGeometry(int(field(f"{arch}.block_count")), kv_heads, head_dim)
