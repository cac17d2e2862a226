"""This machine's processes: whether the writer that left a lock or a claim is still alive,
and whether a live pid is still that writer (`process_start`)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "process_start"]


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


def _boot() -> str | None:
    """This boot of the machine: its id (Linux), else its boot time."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        pass
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return "btime-" + line.split()[1]
    except OSError:
        pass
    return None


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, as a token: equal tokens name the same process, so a
    pid the kernel handed to another process since has another token. None where this
    cannot be told (no such process, or a system without ``/proc``).

    On Linux: the start time in clock ticks after boot (``/proc/<pid>/stat`` field 22) with
    the boot's id, so neither a later process nor one of another boot matches. The boot
    id, not the boot time in seconds: that one moves when the clock is set, and a live
    holder must never look like a stranger.
    """
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # field 2 is the command in parentheses and may hold spaces or ")": split after the last
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    boot = _boot()
    return None if boot is None else f"{fields[19]}@{boot}"
