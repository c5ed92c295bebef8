"""`latentkv heal`'s command line: its defaults are HealConfig's (one fact in one place)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from latentkv.commands import heal as command
from latentkv.heal.trainer import HealConfig


def test_the_command_defaults_are_the_configs():
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = vars(parser.parse_args(["heal", "folder", "--minutes", "1"]))
    defaults = {f.name: f.default for f in fields(HealConfig)}
    for name in (
        "lr",
        "warmup",
        "seq_len",
        "batch",
        "train",
        "lm_weight",
        "save_every",
        "seed",
        "chat_share",
        "eval_examples",
        "eval_every",
    ):
        assert args[name] == defaults[name], name
