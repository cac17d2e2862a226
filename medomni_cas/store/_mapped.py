"""Give back the pages of a memory-mapped file that this process has read (its RSS).

LMDB reads through a read-only shared map of its data file: every page a walk reads stays
mapped in the process (counted in its RSS) until the map is closed, so a walk over a store
of a billion bytes would show a billion bytes resident. `drop` tells the kernel that those
pages are not needed now (``madvise(MADV_DONTNEED)``): for a shared file mapping this
drops the process's page table entries only; the pages stay in the page cache, and a later
read maps them again from there, with the same bytes (a shared mapping has no private
copy to lose). LMDB opened without ``writemap`` never writes through its map; one opened
with it writes through a shared map, whose dirty pages are the page cache's too: dropping
them loses nothing either. A private writable map (copy-on-write: its pages may be the
only copy) is never dropped.

Budget
    Dropping has a price: a page read again after a drop is mapped again (a page fault,
    which maps its neighbours with it), so dropping after every batch makes every read a
    fault. `note` drops only when the process's mapped file pages have grown by more than
    `budget` bytes (``MEDOMNI_MAPPED_BYTES``, default 32 MiB) since the last drop, and then
    every file `watch`ed: a store smaller than that is never dropped, a larger one shows at
    most about that much of itself.

Linux only (the mappings are found in ``/proc/self/maps``); elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["budget", "drop", "each", "note", "unwatch", "watch"]

_MADV_DONTNEED = 4
_ENV = "MEDOMNI_MAPPED_BYTES"
_DEFAULT_BUDGET = 32 << 20
_CHECK_EVERY = 256  # reads between two looks at the mapped pages (each may map 64 KiB)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_watched: dict[str, int] = {}  # real path -> how many holders watch it
_ranges: dict[str, list[tuple[int, int]]] = {}  # real path -> where it was last seen mapped
_since = 0  # reads noted since the last look
_base: int | None = None  # the mapped file pages after the last drop (bytes)
_statm: int | None = None
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


def _mappings(target: str) -> list[tuple[int, int]]:
    """The address ranges at which ``target`` is mapped shared or read-only, from
    ``/proc/self/maps`` (a private writable map may hold what only it has: never listed)."""
    try:
        with open("/proc/self/maps") as f:
            lines = [line for line in f if line.rstrip("\n").endswith(target)]
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[5].strip() != target:
            continue
        if "w" in fields[1] and "s" not in fields[1]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        out.append((start, end))
    return out


def _still(target: str, ranges: list[tuple[int, int]]) -> bool:
    """Whether each of ``ranges`` is still exactly one mapping of ``target``: a look at
    ``/proc/self/map_files`` per range (microseconds), not a read of every mapping (the
    ~0.7 ms that made a drop per 512 reads a tenth of a large walk's time)."""
    try:
        return bool(ranges) and all(
            os.readlink(f"/proc/self/map_files/{start:x}-{end:x}") == target
            for start, end in ranges
        )
    except OSError:  # unmapped, split, or not ours to read: look again
        return False


def drop(path: str | os.PathLike[str]) -> int:
    """Drop this process's mapped pages of the file at ``path``; the bytes of the mappings
    advised (0 when the file is not mapped or the system cannot)."""
    libc = _madvise()
    if libc is None:
        return 0
    target = os.path.realpath(path)
    ranges = _ranges.get(target, [])
    # where the file is mapped is kept between drops, and checked before each: an
    # madvise(DONTNEED) of a range since given to private memory would zero that memory
    if not _still(target, ranges):
        ranges = _ranges[target] = _mappings(target)
    advised = 0
    for start, end in ranges:
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            advised += end - start
    return advised


def budget() -> int:
    """Bytes of mapped file pages a process may gain before `note` drops them."""
    raw = os.environ.get(_ENV, "")
    try:
        return max(0, int(raw)) if raw else _DEFAULT_BUDGET
    except ValueError:
        raise ValueError(f"{_ENV} must be a number of bytes, not {raw!r}") from None


def watch(path: str | os.PathLike[str]) -> None:
    """Have `note` drop the pages of the file at ``path`` too (until `unwatch`)."""
    key = os.path.realpath(path)
    _watched[key] = _watched.get(key, 0) + 1


def unwatch(path: str | os.PathLike[str]) -> None:
    key = os.path.realpath(path)
    left = _watched.get(key, 0) - 1
    if left > 0:
        _watched[key] = left
    else:
        _watched.pop(key, None)
        _ranges.pop(key, None)


def _mapped_now() -> int | None:
    """The process's resident shared pages (file-backed and shmem), in bytes."""
    global _statm
    try:
        if _statm is None:
            _statm = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_statm, 256, 0).split()[2]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def note(reads: int) -> None:
    """``reads`` reads of watched files were made: drop their pages when the mapped pages
    have grown past the `budget` since the last drop (see the module docstring)."""
    global _since, _base
    _since += reads
    if _since < _CHECK_EVERY or _unavailable or not _watched:
        return
    _since = 0
    now = _mapped_now()
    if now is None:
        return
    if _base is None or now < _base:
        _base = now
    if now - _base > budget():
        for path in list(_watched):
            drop(path)
        _base = _mapped_now()


def each[K, T](fn: Callable[[K], T], keys: Sequence[K]) -> list[T]:
    """``fn`` of each of ``keys`` (reads of a watched file), in order: a C-level pass per
    part of `_CHECK_EVERY` keys, `note`d after each (a part maps at most a few MiB)."""
    out: list[T] = []
    for i in range(0, len(keys), _CHECK_EVERY):
        part = keys[i : i + _CHECK_EVERY]
        out += map(fn, part)
        note(len(part))
    return out
