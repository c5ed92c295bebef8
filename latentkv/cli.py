"""`latentkv` command line: one subcommand per job, each registered by its own module."""
from __future__ import annotations

import argparse
import sys

from latentkv.bench import command as bench_command
from latentkv.commands import data, generate, serve
from latentkv.commands import store as store_command
from latentkv.convert import command as convert_command
from latentkv.eval import command as eval_command
from latentkv.heal import command as heal_command

# Each module's `register(subparsers)` adds its subcommands and sets `func` on their parsers.
COMMAND_MODULES = [generate, convert_command, eval_command, heal_command, bench_command, serve, store_command, data]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latentkv", description="Multi-head Latent Attention inference, conversion and measurement.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
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
