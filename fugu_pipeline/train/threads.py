"""torch's intra-op thread count for the small fits of training (the linear heads, the cascade's
verifier): on a busy CPU every small op's OpenMP barrier waits for a thread the OS has descheduled,
so these fits run on one thread (`HEAD_THREADS`) and give the caller's count back."""

from __future__ import annotations

import contextlib

# These heads have a few thousand parameters: a second thread gains nothing (measured equal on an
# idle 2-core machine), but with one other torch process on the 2 cores, `triage_head` took 16-26 s
# instead of 0.5 s and `router_sft` 4.1 s instead of 0.9 s. One thread also keeps the weights
# independent of the core count.
HEAD_THREADS = 1


@contextlib.contextmanager
def torch_threads(threads: int | None = HEAD_THREADS):
    """Use `threads` intra-op threads (None: leave torch's setting) for the duration; the caller's
    count is given back."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
