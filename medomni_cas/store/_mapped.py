"""Give back the pages of a memory-mapped file that this process has read (its RSS).

LMDB reads through a read-only shared map of its data file: every page a walk reads stays
mapped in the process (counted in its RSS) until the map is closed, so a walk over a store
of a billion bytes would show a billion bytes resident. `drop` tells the kernel that those
pages are not needed now (``madvise(MADV_DONTNEED)``): for a shared file mapping this
drops the process's page table entries only; the pages stay in the page cache, and a later
read maps them again from there, with the same bytes (a shared mapping has no private
copy to lose). LMDB opened without ``writemap`` never writes through its map; one opened
with it (a temporary LMDB of `medomni_cas.store._sendplan`) writes through a shared map,
whose dirty pages are the page cache's too: dropping them loses nothing either. A private
writable map (copy-on-write: its pages may be the only copy) is never dropped.

Linux only (the mappings are found in ``/proc/self/maps``); elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

__all__ = ["drop"]

_MADV_DONTNEED = 4
_libc: ctypes.CDLL | None = None
_unavailable = not Path("/proc/self/maps").exists()


def _madvise() -> ctypes.CDLL | None:
    global _libc, _unavailable
    if _libc is None and not _unavailable:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _unavailable = True
    return _libc


def drop(path: str | os.PathLike[str]) -> int:
    """Drop this process's mapped pages of the file at ``path``; the bytes of the mappings
    advised (0 when the file is not mapped or the system cannot)."""
    libc = _madvise()
    if libc is None:
        return 0
    target = os.path.realpath(path)
    advised = 0
    try:
        with open("/proc/self/maps") as f:
            lines = [line for line in f if line.rstrip("\n").endswith(target)]
    except OSError:
        return 0
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[5].strip() != target:
            continue
        if "w" in fields[1] and "s" not in fields[1]:
            continue  # a private writable map may hold what only it has: never dropped
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            advised += end - start
    return advised
