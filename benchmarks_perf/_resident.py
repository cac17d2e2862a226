"""Files held in the page cache for the length of a run: mapped and locked (``mlock``).

A benchmark that reads a store before each run, so that the run finds it in the page cache,
is undone on a machine that pages out what sits idle (DAMON's ``pageout`` here: pages idle
for a minute): during a run of a minute over a 1 GB store, pages the warm read brought in
go back to the disk and are read again, at about 2 ms a page, a cost that falls on the
large sizes and barely on the small ones. Locking the files' pages from the parent keeps
the condition the warm read sets for the whole run, whatever the run's length.

The pages are locked in the parent's address space, not the child's: the child's peak
RSS counts only the pages it maps itself, as before. Where locking is refused (no
``CAP_IPC_LOCK`` and a small ``RLIMIT_MEMLOCK``) or the files would take more than the
budget (half the memory available), the files are read once instead, and `Resident.why`
says why they are not locked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["Resident"]

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _available() -> int:
    """``MemAvailable`` in bytes (0 when the kernel does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _files(folders: Sequence[Path]) -> list[Path]:
    out: list[Path] = []
    for folder in folders:
        paths = sorted(folder.rglob("*")) if folder.is_dir() else [folder]
        out += [p for p in paths if p.is_file() and not p.is_symlink()]
    return out


def _read(path: Path) -> None:
    with path.open("rb", buffering=0) as fh:
        while fh.read(1 << 20):
            pass


def _errno(what: str, path: Path) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what} {path}: {os.strerror(e)}")


class Resident:
    """``with Resident(folders):`` every file under ``folders`` read into the page cache
    and, where it may be, locked there until the block ends.

    ``locked`` is the bytes locked; ``why`` is None when every file was locked, else the
    reason none was (the files are then only read, as a warm read does). ``budget`` caps
    the bytes locked (default: half of ``MemAvailable``)."""

    def __init__(self, folders: Sequence[Path], *, budget: int | None = None) -> None:
        self.folders = list(folders)
        self.budget = _available() // 2 if budget is None else budget
        self.locked = 0
        self.why: str | None = None
        self._maps: list[tuple[int, int]] = []

    def __enter__(self) -> Resident:
        files = _files(self.folders)
        sizes = [p.stat().st_size for p in files]
        total = sum(sizes)
        if total > self.budget:
            self.why = f"{total >> 20} MiB of files, over the budget of {self.budget >> 20} MiB"
        else:
            try:
                for path, size in zip(files, sizes, strict=True):
                    if size:
                        self._lock(path, size)
            except OSError as e:
                self._release()
                self.locked = 0
                self.why = e.strerror or str(e)
        if self.why is not None:
            for path in files:
                _read(path)
        return self

    def _lock(self, path: Path, size: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr is None or addr == _MAP_FAILED:
                raise _errno("mmap", path)
        finally:
            os.close(fd)  # the mapping holds the file
        self._maps.append((addr, size))
        # mlock faults every page in (a read from the disk where it is not cached) and
        # keeps it: the kernel cannot page it out while the lock holds
        if _libc.mlock(addr, size) != 0:
            raise _errno("mlock", path)
        self.locked += size

    def _release(self) -> None:
        for addr, size in self._maps:
            _libc.munlock(addr, size)
            _libc.munmap(addr, size)
        self._maps.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()
