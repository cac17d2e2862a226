"""Writing local files whole or not at all, and durably in batches.

Used by the file backends (``file://``, the large objects of ``lmdb://``) and by whatever
else writes files a reader must never see half written (bench's run folders).

A single file (`atomic_write`) goes to a temp file in the same folder and is renamed into
place.

A batch (`FileWriter`) is written to temp files first, then fsynced together from a few
threads (fsync releases the GIL, and the disk can flush many files in one go instead of one
flush per file), then renamed into place, and finally the folders are fsynced so the renames
survive a crash.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["TMP_PREFIX", "FileWriter", "atomic_write", "fsync_dir"]

TMP_PREFIX = ".tmp-"
# open files per group: far below the usual 1024-descriptor limit
_GROUP = 256


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries, so that renames into it survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(target: Path) -> tuple[int, Path]:
    tmp = target.parent / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(tmp, flags, 0o644), tmp
    except FileNotFoundError:
        target.parent.mkdir(parents=True, exist_ok=True)
        return os.open(tmp, flags, 0o644), tmp


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(target: Path, data: bytes, *, durable: bool) -> None:
    """Write ``target`` whole or not at all: temp file in the same folder, then rename."""
    fd, tmp = _open_temp(target)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class FileWriter:
    """Writes batches of files whole or not at all; with ``durable``, synced on return."""

    def __init__(self, *, durable: bool, threads: int = 8) -> None:
        self.durable = durable
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None

    def write(self, items: Iterable[tuple[Path, bytes | memoryview]]) -> None:
        """Write each ``(target, bytes)``: every file whole, or none of a failed group."""
        items = list(items)
        for i in range(0, len(items), _GROUP):
            self._write_group(items[i : i + _GROUP])

    def _write_group(self, items: list[tuple[Path, bytes | memoryview]]) -> None:
        pending: list[tuple[int, Path, Path]] = []  # (open fd or -1, temp path, target)
        try:
            for target, data in items:
                fd, tmp = _open_temp(target)
                pending.append((fd, tmp, target))
                _write_all(fd, data)
            if self.durable:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="fsync")
                list(self._pool.map(os.fsync, [fd for fd, _, _ in pending]))
            for i, (fd, tmp, target) in enumerate(pending):
                os.close(fd)
                pending[i] = (-1, tmp, target)
                os.replace(tmp, target)
            if self.durable:
                for folder in {target.parent for _, _, target in pending}:
                    fsync_dir(folder)
        except BaseException:
            for fd, tmp, _ in pending:
                if fd >= 0:
                    os.close(fd)
                tmp.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        """Stop the fsync threads (started again by the next durable write)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
