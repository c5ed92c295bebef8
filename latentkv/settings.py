"""Settings of `serve` / `chat` / `generate`: defaults, then a TOML file (`--config FILE`),
then command-line flags. Each option has one name everywhere: the `EngineArgs` field, the
TOML key and the flag (`kv_cache_dtype`, `kv_cache_dtype = "int8"`, `--kv-cache-dtype int8`).

    model = "path/to/model"          # the MODEL argument overrides it
    dtype = "auto"                   # auto | float32 | bfloat16 | float16
    kv_cache_dtype = "int8"          # auto | int8 | fp8_e4m3 | ... (default auto: the folder's format, else the dtype)
    quantization = "none"            # quantized linears: none | int8 | int4 (CPU) | w4a8 | w8a8 (CPU)
    block_size = 16                  # tokens per cache block
    kv_cache_memory = "2GiB"         # the latent cache's size in bytes, or ...
    # kv_cache_blocks = 4096         # ... in blocks (not both)
    max_model_len = 2048
    max_num_seqs = 64
    max_num_batched_tokens = 1024
    enable_prefix_caching = true
    nan_check = true                 # a NaN/Inf in the logits fails that request
    batch_invariant = true           # same greedy tokens alone, batched, chunked or prefix-cached
    kv_store = "~/.cache/latentkv/store"  # on-disk latent store (docs/store.md); kv_store_max_size = "10GiB"
    warm = "templates.jsonl"         # templates prefilled at start; warm_fraction = 0.05 of the cache pinned
    host = "127.0.0.1"               # serve only: host, port, api_key, api_key_file, served_model_name,
    port = 8000                      # max_waiting_requests (more waiting: 503 + Retry-After),
    max_request_bytes = 4194304      # larger bodies: 413 before parsing
    metrics_public = false           # true: /metrics needs no API key
    shutdown_timeout = 30            # seconds SIGTERM / SIGINT waits for requests, then for the store's writes

The seed template's names are aliases (each option's `aliases`): [latent_attention] chunk_size,
prefix_caching; [latent_attention.memory] pool_size (a number of blocks, the seed's "chunks");
[precision] compute, cache, weights; [scheduler] max_model_len, max_num_seqs,
max_waiting_requests; [safety] nan_check; [server] host, port, api_key, served_model_name;
[latent_attention.store] path, max_size, warm, warm_fraction.

An unknown key, a bad value, or one option given twice (or the cache sized both ways) is a
`SettingsError` naming the key or flag and what is allowed. The value rules are the engine's
own (`latentkv.engine.args.OPTION_CHECKS`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from latentkv.engine.args import (
    BATCHED_TOKENS,
    OPTION_CHECKS,
    STORE_MAX_SIZE,
    WARM_FRACTION,
    EngineArgs,
    boolean,
    check_option,
    non_negative_int,
    positive_int,
    text,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the key and the allowed values."""


def option(default, help: str, *aliases: str, server: bool = False, type=None, short: str | None = None):
    """A Settings field: its flag's help, its seed-template TOML aliases, whether only `serve`
    has it, the flag's argparse type and short form."""
    return field(
        default=default, metadata={"help": help, "aliases": aliases, "server": server, "type": type, "short": short}
    )


@dataclass
class Settings:
    """Everything `serve`, `chat` and `generate` need besides the prompt."""

    model: str | None = option(None, "the model (the MODEL argument)")
    dtype: str = option("auto", "model dtype: auto, float32, bfloat16, float16", "precision.compute")
    kv_cache_dtype: str | None = option(
        None,
        "latent cache dtype: auto (the default: the folder's own format where it "
        "records one, as a default conversion does, else the model dtype), int8, "
        "fp8_e4m3, int8_rope8, fp8_e4m3_rope8, q4_0; bfloat16 / float32: the unquantized "
        "latent (the model dtype) whatever the folder records",
        "precision.cache",
    )
    quantization: str | None = option(
        None,
        "quantized linears: none, int8, int4 (weights); w4a8, w4a8_g128 (groups of 128), w8a8 (int8 activations "
        "too); int4, w4a8*, w8a8: CPU",
        "precision.weights",
        short="-q",
    )
    block_size: int = option(16, "tokens per cache block (default 16)", "latent_attention.chunk_size", type=int)
    kv_cache_memory: int | None = option(None, "latent cache size, e.g. 512MiB, 2GiB or bytes")
    kv_cache_blocks: int | None = option(
        None,
        "latent cache size in blocks (instead of --kv-cache-memory)",
        "latent_attention.memory.pool_size",
        type=int,
    )
    max_model_len: int | None = option(None, "longest prompt + output in tokens", "scheduler.max_model_len", type=int)
    max_num_seqs: int = option(64, "sequences running at once (default 64)", "scheduler.max_num_seqs", type=int)
    max_num_batched_tokens: int | None = option(
        None, f"tokens per engine step (default max({BATCHED_TOKENS}, max_num_seqs))", type=int
    )
    enable_prefix_caching: bool = option(
        True, "reuse cached prompt prefixes (default on)", "latent_attention.prefix_caching"
    )
    attention_backend: str = option("auto", "attention kernels: auto (native C++ where it builds), native, torch")
    threads: int | None = option(
        None,
        "CPU threads (default: $LATENTKV_THREADS, else $OMP_NUM_THREADS, else all cores, "
        "fewer while other processes hold some)",
        type=int,
    )
    nan_check: bool = option(True, "fail a request whose logits hold NaN/Inf (default on)", "safety.nan_check")
    batch_invariant: bool = option(
        True,
        "the same greedy tokens alone, batched, chunked or prefix-cached "
        "(default on; docs/internals.md, 'Batch invariance')",
    )
    enforce_eager: bool = option(
        False,
        "run every step through the PyTorch modules, without the native decode plan "
        "(as vLLM's --enforce-eager skips CUDA graphs; docs/internals.md)",
    )
    kv_store: str | None = option(
        None,
        "keep full prefix-cache blocks on disk in this directory, reused across "
        "restarts and shared by processes (docs/store.md)",
        "latent_attention.store.path",
    )
    kv_store_max_size: int | str = option(
        STORE_MAX_SIZE,
        f"bound of the --kv-store directory (default {STORE_MAX_SIZE})",
        "latent_attention.store.max_size",
    )
    warm: str | None = option(
        None,
        "JSONL of template prompts or chat conversations prefilled at start and pinned",
        "latent_attention.store.warm",
    )
    warm_fraction: float = option(
        WARM_FRACTION,
        f"share of the cache --warm templates may pin (default {WARM_FRACTION})",
        "latent_attention.store.warm_fraction",
        type=float,
    )
    host: str = option("127.0.0.1", "address to bind (default 127.0.0.1)", "server.host", server=True)
    port: int = option(8000, "port (default 8000)", "server.port", server=True, type=int)
    api_key: str | None = option(
        None,
        "require 'Authorization: Bearer KEY' on every route but /health (shows in "
        "`ps`: prefer --api-key-file or $LATENTKV_API_KEY)",
        "server.api_key",
        server=True,
    )
    api_key_file: str | None = option(None, "read the API key from this file", "server.api_key_file", server=True)
    metrics_public: bool = option(
        False, "serve /metrics without the API key (default off)", "server.metrics_public", server=True
    )
    max_request_bytes: int = option(
        DEFAULT_MAX_REQUEST_BYTES,
        f"refuse larger request bodies with 413, before parsing (default {DEFAULT_MAX_REQUEST_BYTES})",
        "server.max_request_bytes",
        server=True,
        type=int,
    )
    served_model_name: str | None = option(
        None, "the model name clients send (default: the model's)", "server.served_model_name", server=True
    )
    max_waiting_requests: int = option(
        256,
        "answer 503 + Retry-After when more sequences than this would wait (default 256)",
        "scheduler.max_waiting_requests",
        server=True,
        type=int,
    )
    shutdown_timeout: float = option(
        30.0,
        "on SIGTERM / SIGINT: seconds running requests may finish in, then the "
        "KV store's queued writes (default 30; a second signal exits at once)",
        "server.shutdown_timeout",
        server=True,
        type=float,
    )

    def engine_args(self, model: str, kv_cache_dtype: str) -> EngineArgs:
        """EngineArgs for the resolved model folder: every engine option by its own name."""
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not f.metadata["server"] and f.name not in ("model", "kv_cache_dtype")
        }
        return EngineArgs(model=model, kv_cache_dtype=kv_cache_dtype, **values)


def _seconds(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError
    return float(value)


def _port(value):
    value = non_negative_int(value)
    if value > 65535:
        raise ValueError
    return value


# The engine's rules, plus the server's own options.
CHECKS = {
    **OPTION_CHECKS,
    "kv_cache_blocks": (
        "a positive number of cache blocks (for a size in bytes use kv_cache_memory)",
        OPTION_CHECKS["kv_cache_blocks"][1],
    ),
    "host": ("a host name or address", text),
    "port": ("an integer port 0-65535", _port),
    "api_key": ("a non-empty string", text),
    "api_key_file": ("a file path", text),
    "metrics_public": ("true or false", boolean),
    "max_request_bytes": ("a positive integer", positive_int),
    "served_model_name": ("a non-empty string", text),
    "max_waiting_requests": ("an integer >= 0", non_negative_int),
    "shutdown_timeout": ("a number of seconds >= 0", _seconds),
}
OPTIONS = {f.name: f for f in fields(Settings)}
TOML_KEYS = {name: name for name in OPTIONS} | {
    alias: f.name for f in fields(Settings) for alias in f.metadata["aliases"]
}
CACHE_SIZE = ("kv_cache_memory", "kv_cache_blocks")  # two units of one setting


def check_value(where: str, name: str, value):
    """`value` cleaned for option `name`, or SettingsError naming `where` (key or flag)."""
    try:
        return check_option(name, value, where, CHECKS)
    except ValueError as err:
        raise SettingsError(str(err)) from None


def flatten(table: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; an empty table stays a key (and is refused as unknown)."""
    flat = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            if not value:
                flat[path] = value
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def allowed_keys_near(path: str) -> list[str]:
    """The known keys in the same table as `path` (or the options' own names when none is)."""
    table = path.rpartition(".")[0]
    near = [k for k in TOML_KEYS if table and k.rpartition(".")[0] == table]
    return near or list(OPTIONS)


def check_cache_size(values: dict, where: str) -> None:
    if all(values.get(name) is not None for name in CACHE_SIZE):
        raise SettingsError(
            f"{where}: kv_cache_memory and kv_cache_blocks (pool_size) both size the latent cache; give one"
        )


def read_toml(path: str | Path) -> dict[str, object]:
    """Settings fields from a TOML file; raises SettingsError for a bad file, key or value."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{path}: not valid TOML: {err}") from None
    values, given_as = {}, {}
    for key, value in flatten(raw).items():
        if key not in TOML_KEYS:
            raise SettingsError(f"{path}: unknown key {key!r}; allowed keys here: {', '.join(allowed_keys_near(key))}")
        name = TOML_KEYS[key]
        if name in given_as:
            raise SettingsError(f"{path}: {given_as[name]!r} and {key!r} both set {name}; give one")
        given_as[name] = key
        values[name] = check_value(f"{path}: {key}", name, value)
    check_cache_size(values, str(path))
    return values


def build_settings(config_file: str | Path | None = None, overrides: dict | None = None) -> Settings:
    """Defaults, then the TOML file, then `overrides` (flags by option name; None: not given)."""
    values = read_toml(config_file) if config_file else {}
    flags = {}
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in OPTIONS:
            raise SettingsError(f"unknown setting {name!r}; known: {list(OPTIONS)}")
        flags[name] = value if name == "model" else check_value("--" + name.replace("_", "-"), name, value)
    check_cache_size(flags, "flags")
    if any(name in flags for name in CACHE_SIZE):  # a flag sizes the cache: the file's size goes
        for name in CACHE_SIZE:
            values.pop(name, None)
    return Settings(**(values | flags))


def add_engine_arguments(parser: argparse.ArgumentParser, server: bool = False) -> None:
    """MODEL, --config and a flag per option (`serve`'s own ones with server=True). Every flag
    defaults to None, so a `--config` file's values apply unless the flag is given."""
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a latentkv/DeepSeek folder, a Llama-family GGUF file or HF folder (converted and cached), "
        "or nothing for the bundled SmolLM2-135M-Instruct",
    )
    parser.add_argument("--config", default=None, metavar="FILE", help="TOML settings file (flags override it)")
    for f in fields(Settings):
        meta = f.metadata
        if f.name == "model" or (meta["server"] and not server):
            continue
        names = ["--" + f.name.replace("_", "-")] + ([meta["short"]] if meta["short"] else [])
        if isinstance(f.default, bool):
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, help=meta["help"])
        else:
            parser.add_argument(*names, type=meta["type"], default=None, help=meta["help"])


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed arguments: `--config` first, then every flag that was given."""
    return build_settings(getattr(args, "config", None), {name: getattr(args, name, None) for name in OPTIONS})
