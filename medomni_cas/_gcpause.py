"""Pause Python's cyclic garbage collector while a bulk read builds many objects.

The collector runs each time the count of container objects allocated (net) passes a
threshold, and a full collection walks every live container. A read that builds one
container per item (an `ObjectId` is one: a heap type's instances are tracked) and keeps
them all makes each full collection cost more than the last, so the share of time spent
collecting grows with the work: resuming 80,000 slots spent 18% of its time in the
collector (two full collections over 136,000 objects), resuming 5,000 spent 4%. The
objects such a read builds hold no cycles (bytes, tuples, dicts of them), so nothing is
left for the collector to free: pausing it loses nothing, and the collector runs again at
its next threshold after the pause, as usual (the same remedy as Mercurial's
``util.nogc`` for the same cost). Resume, a push or pull's transfer and the checking walk
(verify, fsck, gc's mark) run paused: a push of 1.44M objects spent 6.7% of its time
collecting, one of 90k 5.6% (`perf record` samples).

The pause is process-wide (the collector is). The call that turned the collector off
turns it back on when it returns, even while another thread's pause still runs (that one
then runs with it on, as it would without a pause); a call that found it off leaves it
off, so a collector the program turned off stays off.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator

__all__ = ["gc_paused", "paused"]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block, then back as it was (on, unless it was off)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def gc_paused[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run with the collector `paused`."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused():
            return fn(*args, **kwargs)

    return call
