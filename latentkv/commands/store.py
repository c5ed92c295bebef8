"""`latentkv store ls | warm | clear DIR`: inspect, pre-fill and empty a latent store."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from latentkv.commands.interrupt import close, exit_status, sigterm_unwinds
from latentkv.commands.startup import start_engine
from latentkv.engine.warm import warm_up
from latentkv.settings import SettingsError, add_engine_arguments, settings_from_args
from latentkv.store.store import count_blocks, model_dirs


def register(subparsers) -> None:
    store = subparsers.add_parser("store", help="inspect, pre-fill or empty an on-disk latent store (--kv-store)")
    sub = store.add_subparsers(dest="store_command", metavar="ACTION")
    p = sub.add_parser("ls", help="list the models with blocks in DIR: blocks, size, last use")
    p.add_argument("dir")
    p.set_defaults(func=run_ls)
    p = sub.add_parser("warm", help="prefill the templates of a JSONL FILE with MODEL and write their blocks to DIR")
    p.add_argument("dir")
    p.add_argument(
        "file", help='JSONL: one prompt, {"prompt": ...}, {"prompt_token_ids": [...]} or {"messages": [...]} per line'
    )
    add_engine_arguments(p)
    p.set_defaults(func=run_warm)
    p = sub.add_parser("clear", help="delete every block in DIR (all models)")
    p.add_argument("dir")
    p.set_defaults(func=run_clear)
    store.set_defaults(func=lambda a: store.print_help() or 2)


def run_ls(args) -> int:
    root = Path(args.dir).expanduser()
    if not root.is_dir():
        print(f"latentkv store: {root} is not a directory", file=sys.stderr)
        return 2
    print(f"{'fingerprint':12}  {'blocks':>8}  {'MiB':>9}  {'last used':19}  model")
    total = 0
    for d in model_dirs(root):
        count, nbytes, newest = count_blocks(d)
        total += nbytes
        try:
            meta = json.loads((d / "model.json").read_text())
        except (OSError, ValueError):
            meta = {}
        what = (
            f"{meta.get('model', '?')} ({meta.get('dtype')}, cache {meta.get('kv_cache_dtype')}, "
            f"block {meta.get('block_size')}{', ' + meta['quantization'] if meta.get('quantization') else ''})"
        )
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest)) if newest else "-"
        print(f"{d.name[:12]:12}  {count:8d}  {nbytes / 2**20:9.1f}  {used:19}  {what}")
    print(f"total {total / 2**20:.1f} MiB in {root}")
    return 0


def run_warm(args) -> int:
    """Prefill the templates, then close the engine (its queue written); stopped by SIGTERM or Ctrl-C,
    it still writes what the finished templates queued and exits 128 + the signal."""
    with sigterm_unwinds():
        return warm(args)


def warm(args) -> int:
    engine = tier = None
    status, timeout = 0, 0.0
    try:
        settings = settings_from_args(args)
        settings.kv_store, timeout = args.dir, settings.shutdown_timeout
        engine, _ = start_engine(settings)
        tier = engine.store
        if tier is None:
            print(f"latentkv store warm: the store {args.dir} is not usable (see the warning above)", file=sys.stderr)
            return 1
        warm_up(engine, args.file, settings.warm_fraction)
    except (SettingsError, ValueError) as err:
        print(f"latentkv store warm: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        status = exit_status(err)
    finally:
        close(engine, timeout)  # writes every queued block
    if tier is None:  # stopped before the store was open
        return status
    c = tier.counters
    print(
        f"latentkv store warm: {c.bytes_written / 2**20:.1f} MiB written to {args.dir} "
        f"({tier.store.num_blocks()} blocks for this model; {c.write_drops} dropped)"
        + (" (interrupted)" if status else "")
    )
    return status or (0 if c.write_drops == 0 else 1)


def run_clear(args) -> int:
    root = Path(args.dir).expanduser()
    dirs = model_dirs(root) if root.is_dir() else []
    if not dirs:
        print(f"latentkv store: {root} holds no latent store; nothing deleted", file=sys.stderr)
        return 0 if root.is_dir() else 2
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    (root / ".size").unlink(missing_ok=True)
    print(f"latentkv store: cleared {len(dirs)} model(s) from {root}")
    return 0
