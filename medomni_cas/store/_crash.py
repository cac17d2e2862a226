"""Crash points: where the tests SIGKILL a writer, between two of its durable writes.

A writer calls `crash_point` after each batch it has made durable. When the environment
variable `CRASH_ENV` says ``<point>:<k>`` (``write:3``), the process kills itself with
SIGKILL at the k-th call of that point: a real kill at a chosen place, which a timer cannot
hit reliably. Unset (always, outside tests), a call costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "crash_point"]

CRASH_ENV = "MEDOMNI_TEST_CRASH"
_counts: dict[str, int] = {}


def crash_point(point: str) -> None:
    """Count a call of ``point``; SIGKILL this process if `CRASH_ENV` names this call."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    name, _, at = spec.partition(":")
    if name != point:
        return
    _counts[point] = n = _counts.get(point, 0) + 1
    if str(n) == at:
        os.kill(os.getpid(), signal.SIGKILL)
