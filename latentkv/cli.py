"""`latentkv` command line: one subcommand per job, each registered by its own module of
latentkv/commands/ (the only place that parses arguments; it imports the packages, never the reverse)."""

from __future__ import annotations

import argparse
import sys

from latentkv.commands import bench, convert, data, export, generate, heal, serve, store
from latentkv.commands import eval as evaluate

# One module per subcommand in latentkv/commands/ (`generate` also adds `chat`, `convert` adds
# `convert-sweep`); each one's `register(subparsers)` adds its parsers and sets their `func`.
COMMAND_MODULES = [generate, convert, export, evaluate, heal, bench, serve, store, data]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latentkv", description="Multi-head Latent Attention inference, conversion and measurement."
    )
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
