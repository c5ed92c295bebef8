"""`latentkv` command line: one subcommand per job, each registered by its own module."""
from __future__ import annotations

import argparse
import importlib
import sys

# (module, attribute) pairs; each `register(subparsers)` adds its subcommands and
# sets `func` on its parser. Modules are imported lazily so a broken optional
# piece cannot take the whole CLI down.
COMMAND_MODULES = [
    "latentkv.commands.generate",
    "latentkv.convert.command",
    "latentkv.eval.command",
    "latentkv.heal.command",
    "latentkv.bench.command",
    "latentkv.server.command",
    "latentkv.store.command",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latentkv", description="Multi-head Latent Attention inference, conversion and measurement.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            # One broken piece (say, the converter) must not take `serve` down with it.
            print(f"latentkv: warning: {name} is unavailable ({err}); its commands are missing", file=sys.stderr)
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
