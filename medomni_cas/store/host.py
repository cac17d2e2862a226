"""This machine's processes: whether the writer that left a lock or a claim is still alive."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (in this pid namespace).

    A process owned by another user counts as alive: it exists, it is just not ours to
    signal. Only a pid on *this* host can be checked; callers decide what a lock or claim
    held on another host means. Zero and negative pids name process groups, not a process.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
