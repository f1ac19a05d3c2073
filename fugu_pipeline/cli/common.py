"""What every command shares: the error a command raises for the user, the encoder default, JSON output."""

from __future__ import annotations

import json
import os

from fugu_pipeline.settings import settings


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def encoder_name(args) -> str:
    return args.encoder or settings().encoder


def check_encoder(name: str) -> None:
    """EncoderLoadError at once, before any paid work, when the encoder cannot be found: 'tiny', a
    local model folder, or a hub id in the local cache or on the hub (whose config is fetched)."""
    from fugu_pipeline.features.settings import EncoderLoadError, EncoderSettings

    settings = EncoderSettings(model=name)
    if settings.check_loadable():
        return
    try:
        settings.hidden_layers()
    except OSError as exc:  # the hub does not know it (or refuses it)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EncoderLoadError(f"encoder {name!r}: {first}") from None


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=float))


def check_prompt(prompt: str) -> None:
    """A prompt from the command line can hold lone surrogates (undecodable bytes in argv): refuse
    it with a message instead of a traceback when it reaches the worker's JSON. An empty one is
    refused too: there is nothing to route, and `ask` would pay workers to answer nothing."""
    if not prompt.strip():
        raise CLIError("--prompt is empty: give the text to route")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CLIError(f"--prompt is not valid UTF-8 text (undecodable byte at character {exc.start})") from None


def asked_by(args, command: str) -> str | None:
    """Who asked for a promoted head that cannot be loaded to be replaced, as the history's
    `replace_broken_king` records it: the flag, the command and the host's user; None without
    --replace-broken-king (such a king then stops the attempt)."""
    if not getattr(args, "replace_broken_king", False):
        return None
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): the flag and the command still say it
        user = f"uid {os.getuid()}"
    return f"--replace-broken-king (fugu-lite {command}, user {user})"
