"""What every command shares: the error a command raises for the user, the encoder default, JSON output."""

from __future__ import annotations

import json
import os

DEFAULT_ENCODER = "Qwen/Qwen3-0.6B"


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def encoder_name(args) -> str:
    return args.encoder or os.environ.get("FUGU_ENCODER") or DEFAULT_ENCODER


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=float))
