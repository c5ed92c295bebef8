"""Engine, cache and server settings for `serve` / `chat` / `generate`: defaults, a TOML
config file (`--config FILE`) and command-line flags, in that order of precedence.

The file's names follow the seed's config template where they fit:

    model = "path/to/model"          # optional; the MODEL argument overrides it

    [latent_attention]
    chunk_size = 16                  # tokens per cache block (block_size)
    prefix_caching = true

    [latent_attention.store]          # the on-disk latent store (docs/store.md)
    path = "~/.cache/latentkv/store"  # blocks survive restarts here; shared by processes
    max_size = "20GiB"               # the whole directory, LRU-evicted beyond it
    warm = "templates.jsonl"         # prompts / conversations prefilled at start
    warm_fraction = 0.05             # of the cache the templates may pin in RAM

    [latent_attention.memory]
    pool_size = "2GiB"               # the latent cache: bytes ("512MiB", 1073741824) or,
                                     # as an int below 2**20, a number of chunks (blocks)

    [precision]
    compute = "auto"                 # model dtype: auto | float32 | bfloat16 | float16
    cache = "int8"                   # latent cache: auto | int8 | fp8_e4m3 (default: int8
                                     # for the bundled model, whose compression assumes it; else auto)
    weights = "none"                 # weight-only quantization: none | int8 | int4 (int4: CPU)

    [scheduler]
    max_model_len = 2048
    max_num_seqs = 64
    max_waiting_requests = 256       # more waiting than this: 503 + Retry-After

    [safety]
    nan_check = true                 # a NaN/Inf in the logits fails that request

    [server]
    host = "127.0.0.1"
    port = 8000
    api_key = "secret"
    served_model_name = "smollm2"

An unknown key or a bad value raises `SettingsError` naming the key and what is allowed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DTYPES = ("auto", "float32", "bfloat16", "float16")
CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3", "bf16": "auto", "fp16": "auto", "float16": "auto", "bfloat16": "auto"}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
QUANTIZATIONS = ("none", "int8", "int4")
POOL_BLOCKS_LIMIT = 2**20  # an int pool_size below this counts chunks, at or above it bytes


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the key and the allowed values."""


@dataclass
class Settings:
    """Everything `serve`, `chat` and `generate` need besides the prompt."""

    model: str | None = None
    dtype: str = "auto"
    kv_cache_dtype: str | None = None          # None: int8 for the bundled model, else "auto"
    quantization: str = "none"                 # weight-only: none | int8 | int4
    block_size: int = 16
    kv_cache_memory: int | str | None = None   # bytes or "2GiB"; None: the engine's default
    kv_cache_blocks: int | None = None         # pool_size as a number of blocks
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_waiting_requests: int = 256
    enable_prefix_caching: bool = True
    nan_check: bool = True
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    kv_store: str | None = None                # on-disk latent store directory; None: off
    kv_store_max_size: int | str | None = None  # None: the engine's default
    warm: str | None = None                    # JSONL templates prefilled at start
    warm_fraction: float | None = None         # None: the engine's default


# TOML key path -> Settings field. Value checks live in `check_value`.
TOML_KEYS: dict[str, str] = {
    "model": "model",
    "latent_attention.chunk_size": "block_size",
    "latent_attention.prefix_caching": "enable_prefix_caching",
    "latent_attention.memory.pool_size": "kv_cache_memory",
    "latent_attention.store.path": "kv_store",
    "latent_attention.store.max_size": "kv_store_max_size",
    "latent_attention.store.warm": "warm",
    "latent_attention.store.warm_fraction": "warm_fraction",
    "precision.compute": "dtype",
    "precision.cache": "kv_cache_dtype",
    "precision.weights": "quantization",
    "scheduler.max_model_len": "max_model_len",
    "scheduler.max_num_seqs": "max_num_seqs",
    "scheduler.max_waiting_requests": "max_waiting_requests",
    "safety.nan_check": "nan_check",
    "server.host": "host",
    "server.port": "port",
    "server.api_key": "api_key",
    "server.served_model_name": "served_model_name",
}

# Settings field -> (description of allowed values, checker returning the clean value or raising)
def _positive_int(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError
    return value


def _non_negative_int(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError
    return value


def _bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "on", "yes", "1", "false", "off", "no", "0"):
        return value.lower() in ("true", "on", "yes", "1")
    raise ValueError


def _choice(allowed, aliases=None):
    def check(value):
        value = (aliases or {}).get(value, value)
        if value not in allowed:
            raise ValueError
        return value
    return check


def _text(value):
    if not isinstance(value, str) or not value:
        raise ValueError
    return value


def _fraction(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError
    return float(value)


def _port(value):
    value = _non_negative_int(value)
    if value > 65535:
        raise ValueError
    return value


def _memory(value):
    from latentkv.engine.runner import parse_memory
    if isinstance(value, bool):
        raise ValueError
    parse_memory(value)  # raises ValueError for a bad size
    return value


CHECKS = {
    "model": ("a path", _text),
    "dtype": (f"one of {list(DTYPES)}", _choice(DTYPES, DTYPE_ALIASES)),
    "kv_cache_dtype": (f"one of {list(CACHE_DTYPES)}", _choice(CACHE_DTYPES, CACHE_DTYPE_ALIASES)),
    "quantization": (f"one of {list(QUANTIZATIONS)}", _choice(QUANTIZATIONS)),
    "block_size": (f"one of {list(BLOCK_SIZES)}", _choice(BLOCK_SIZES)),
    "kv_cache_memory": ("a size such as \"2GiB\" or bytes, or a number of chunks below 2**20", _memory),
    "max_model_len": ("a positive integer", _positive_int),
    "max_num_seqs": ("a positive integer", _positive_int),
    "max_waiting_requests": ("an integer >= 0", _non_negative_int),
    "enable_prefix_caching": ("true or false", _bool),
    "nan_check": ("true or false", _bool),
    "host": ("a host name or address", _text),
    "port": ("an integer port 0-65535", _port),
    "api_key": ("a non-empty string", _text),
    "served_model_name": ("a non-empty string", _text),
    "kv_store": ("a directory path", _text),
    "kv_store_max_size": ("a size such as \"20GiB\" or bytes", _memory),
    "warm": ("a JSONL file path", _text),
    "warm_fraction": ("a number from 0 to 1", _fraction),
}


def check_value(key: str, field_name: str, value):
    """Return `value` cleaned for `field_name`, or raise SettingsError naming `key`."""
    allowed, checker = CHECKS[field_name]
    try:
        return checker(value)
    except (ValueError, TypeError):
        raise SettingsError(f"{key} = {value!r} is not valid; allowed: {allowed}") from None


def flatten(table: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; tables that are known keys themselves stay whole."""
    flat = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in TOML_KEYS:
            if not value:
                flat[path] = value
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def allowed_keys_near(path: str) -> list[str]:
    """The known keys in the same table as `path` (or all of them when none is)."""
    table = path.rpartition(".")[0]
    near = [k for k in TOML_KEYS if k.rpartition(".")[0] == table]
    return near or sorted(TOML_KEYS)


def read_toml(path: str | Path) -> dict[str, object]:
    """Settings fields from a TOML file; raises SettingsError for a bad file, key or value."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{path}: not valid TOML: {err}") from None
    values = {}
    for key, value in flatten(raw).items():
        if key not in TOML_KEYS:
            raise SettingsError(f"{path}: unknown key {key!r}; allowed keys here: {', '.join(allowed_keys_near(key))}")
        field_name = TOML_KEYS[key]
        values[field_name] = check_value(key, field_name, value)
    split_pool_size(values)
    return values


def split_pool_size(values: dict) -> None:
    """An int pool_size below 2**20 counts chunks (blocks), as in the seed; else bytes."""
    size = values.get("kv_cache_memory")
    if isinstance(size, int) and size < POOL_BLOCKS_LIMIT:
        values["kv_cache_blocks"] = values.pop("kv_cache_memory")


def build_settings(config_file: str | Path | None = None, overrides: dict | None = None) -> Settings:
    """Defaults, then the TOML file, then `overrides` (CLI flags; None values are ignored)."""
    values = read_toml(config_file) if config_file else {}
    known = {f.name for f in fields(Settings)}
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in known:
            raise SettingsError(f"unknown setting {name!r}; known: {sorted(known)}")
        values[name] = check_value("--" + name.replace("_", "-"), name, value) if name in CHECKS else value
        if name == "kv_cache_memory":
            values.pop("kv_cache_blocks", None)
    return Settings(**values)


def add_engine_arguments(parser) -> None:
    """The engine options shared by serve / chat / generate (all default to None, so a
    `--config` file's values apply unless a flag is given)."""
    parser.add_argument("model", nargs="?", default=None,
                        help="a latentkv/DeepSeek folder, a Llama-family GGUF file or HF folder (converted and cached), "
                             "or nothing for the bundled SmolLM2-135M-Instruct")
    parser.add_argument("--config", default=None, metavar="FILE", help="TOML settings file (flags override it)")
    parser.add_argument("--dtype", default=None, help=f"model dtype: {', '.join(DTYPES)}")
    parser.add_argument("--kv-cache-dtype", default=None, help=f"latent cache dtype: {', '.join(CACHE_DTYPES)}")
    parser.add_argument("--quantization", "-q", default=None,
                        help=f"weight-only quantization of the linears: {', '.join(QUANTIZATIONS)} (int4: CPU)")
    parser.add_argument("--block-size", type=int, default=None, help="tokens per cache block (default 16)")
    parser.add_argument("--kv-cache-memory", default=None, help="latent cache size, e.g. 512MiB, 2GiB or bytes")
    parser.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output in tokens")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="sequences running at once (default 64)")
    caching = parser.add_mutually_exclusive_group()
    caching.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_const", const=True,
                         default=None, help="reuse cached prompt prefixes (default on)")
    caching.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_const",
                         const=False, help="turn prefix caching off")
    nan = parser.add_mutually_exclusive_group()
    nan.add_argument("--nan-check", dest="nan_check", action="store_const", const=True, default=None,
                     help="fail a request whose logits hold NaN/Inf (default on)")
    nan.add_argument("--no-nan-check", dest="nan_check", action="store_const", const=False, help="skip that check")
    parser.add_argument("--kv-store", default=None, metavar="DIR",
                        help="keep full prefix-cache blocks on disk in DIR, reused across restarts (docs/store.md)")
    parser.add_argument("--kv-store-max-size", default=None, metavar="SIZE", help="bound of DIR, e.g. 20GiB (default 10GiB)")
    parser.add_argument("--warm", default=None, metavar="FILE",
                        help="JSONL of template prompts or chat conversations to prefill at start and pin")
    parser.add_argument("--warm-fraction", type=float, default=None,
                        help="share of the cache the templates may pin in RAM (default 0.05)")


ENGINE_FLAGS = ("model", "dtype", "kv_cache_dtype", "quantization", "block_size", "kv_cache_memory", "max_model_len",
                "max_num_seqs", "enable_prefix_caching", "nan_check", "kv_store", "kv_store_max_size", "warm",
                "warm_fraction")


def settings_from_args(args, extra: tuple[str, ...] = ()) -> Settings:
    """Settings from parsed arguments: `--config` first, then every flag that was given."""
    overrides = {name: getattr(args, name, None) for name in ENGINE_FLAGS + extra}
    return build_settings(getattr(args, "config", None), overrides)
