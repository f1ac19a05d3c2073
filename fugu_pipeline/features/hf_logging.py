"""Quiet `transformers` loads: callers print one line naming the encoder instead of progress bars."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def quiet_transformers():
    """No per-load progress bars: callers print one `describe()` line instead."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
