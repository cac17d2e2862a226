"""Which staged files an agent opened: Linux inotify on the working folder, through libc.

The kernel reports every open of a watched file, by any process, so the record does not
depend on the agent telling the truth. Only the top folder and the folders under it at start
are watched (staging is flat); on systems without inotify the watcher reports nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

__all__ = ["OpenWatcher"]

IN_OPEN = 0x00000020
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")


class OpenWatcher:
    """``with OpenWatcher(folder) as w: ...; w.opened()`` -> names opened, sorted."""

    def __init__(self, folder: Path, ignore: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.ignore = set(ignore)
        self._fd = -1
        self._dirs: dict[int, str] = {}
        self._seen: set[str] = set()

    def __enter__(self) -> OpenWatcher:
        name = ctypes.util.find_library("c")
        if name is None:
            return self
        libc = ctypes.CDLL(name, use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return self
        self._fd = fd
        for d in [self.folder, *(p for p in self.folder.rglob("*") if p.is_dir())]:
            wd = libc.inotify_add_watch(fd, os.fsencode(d), IN_OPEN)
            if wd >= 0:
                rel = d.relative_to(self.folder).as_posix()
                self._dirs[wd] = "" if rel == "." else rel + "/"
        return self

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            if not buf:
                return
            off = 0
            while off < len(buf):
                wd, _mask, _cookie, length = _EVENT.unpack_from(buf, off)
                raw = buf[off + _EVENT.size : off + _EVENT.size + length].rstrip(b"\0")
                off += _EVENT.size + length
                if raw:
                    name = self._dirs.get(wd, "") + os.fsdecode(raw)
                    if name not in self.ignore:
                        self._seen.add(name)

    def opened(self) -> list[str]:
        if self._fd >= 0:
            self._drain()
        return sorted(self._seen)

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            self._drain()
            os.close(self._fd)
            self._fd = -1
