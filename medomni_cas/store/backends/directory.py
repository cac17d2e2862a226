"""A git-like folder of files: ``file://PATH``. Safe for several processes at once.

Layout of ``PATH/``::

    objects/ab/cdef…     one file per object, fan-out by the first two hex characters
    refs/<name>          one file per ref; the name percent-encoded into one flat file name
    refs/<name>.lock     held while a ref is updated (made by hard-linking a finished
                         file holding "pid host", so it never appears empty);
                         broken when its holder's pid is dead on this host, or after
                         LOCK_STALE_AFTER seconds when the holder cannot be checked
    logs/<name>          the ref's history: 4-byte big-endian length + entry, appended
    names/~<hash>        the full name of a ref whose encoded name is too long for a file

Every file is written to a ``.tmp-*`` file in the same folder and renamed into place, so a
killed writer leaves at most a temp file, which listings skip and gc removes once it is
older than its grace period (`DirectoryBackend.remove_orphans`).

A ref file holds two lines: the hex id (``-`` once deleted) and the length of the committed
history; a third, where present, is the offset of the history's last entry (which the next
entry's hash chain links; without it the history is read whole). The rename of the ref file
is the commit point of an update: history bytes past that length belong to a writer that
died before committing, so readers ignore them and the next writer truncates them away.
Deleted refs keep their file (a tombstone) so that the history stays reachable and its
length known.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import parse_qs

from medomni_cas.store._crash import crash_point
from medomni_cas.store.backend import FRESHEN_AFTER, Backend, Entry, no_store
from medomni_cas.store.backends._layout import (
    decode_ref_name,
    encode_ref_name,
    key_of,
    object_path,
)
from medomni_cas.store.files import TMP_PREFIX, FileWriter, atomic_write, fsync_dir
from medomni_cas.store.host import pid_alive

__all__ = [
    "DEAD_HOLDER_GRACE",
    "LOCK_STALE_AFTER",
    "LOCK_TIMEOUT",
    "DirectoryBackend",
    "parse_log",
]

LOCK_TIMEOUT = 10.0
LOCK_STALE_AFTER = 60.0
DEAD_HOLDER_GRACE = 2.0
_LEN = struct.Struct(">I")
_TOMBSTONE = "-"


# -- the history file --------------------------------------------------------------------------
def parse_log(data: bytes, end: int | None = None) -> list[bytes]:
    """Length-prefixed entries of ``data[:end]``; a truncated trailing entry is ignored."""
    view = memoryview(data)[:end]
    out: list[bytes] = []
    pos = 0
    while pos + _LEN.size <= len(view):
        (n,) = _LEN.unpack_from(view, pos)
        if pos + _LEN.size + n > len(view):
            break  # a writer died mid-append: not part of the history
        out.append(bytes(view[pos + _LEN.size : pos + _LEN.size + n]))
        pos += _LEN.size + n
    return out


class _RefState:
    """A ref file's content: the id (None when absent or deleted), the history length and
    the offset of its last entry (None: not recorded, in files written before)."""

    __slots__ = ("last", "log_end", "value")

    def __init__(self, value: bytes | None, log_end: int, last: int | None = None) -> None:
        self.value = value
        self.log_end = log_end
        self.last = last

    @classmethod
    def parse(cls, text: str, where: Path) -> _RefState:
        lines = text.split("\n")
        try:
            value = None if lines[0] == _TOMBSTONE else bytes.fromhex(lines[0])
            log_end = int(lines[1]) if len(lines) > 1 and lines[1] else 0
            last = int(lines[2]) if len(lines) > 2 and lines[2] else None
        except ValueError:
            raise ValueError(f"{where}: not a ref file (expected hex id and log length)") from None
        return cls(value, log_end, last)

    def dump(self) -> bytes:
        head = _TOMBSTONE if self.value is None else self.value.hex()
        tail = "" if self.last is None else f"{self.last}\n"
        return f"{head}\n{self.log_end}\n{tail}".encode()


class DirectoryBackend(Backend):
    """Objects and refs as plain files under one folder (see the module docstring)."""

    supports_atomic_refs = True

    def __init__(
        self, path: str | os.PathLike[str], *, durable: bool = True, url: str | None = None
    ) -> None:
        # absolute, so that a later chdir does not move the store
        self.path = Path(os.path.abspath(path))
        self.url = url or f"file://{self.path}"
        self.durable = durable
        self._writer = FileWriter(durable=durable)
        self._objects = self.path / "objects"
        self._refs = self.path / "refs"
        self._logs = self.path / "logs"
        self._names = self.path / "names"
        for d in (self._objects, self._refs, self._logs, self._names):
            d.mkdir(parents=True, exist_ok=True)
        self._host = socket.gethostname()

    @classmethod
    def from_url(cls, url: str) -> DirectoryBackend:
        """``file:///abs/path`` or ``file://./rel``; ``?fsync=0`` trades durability for speed."""
        path, query = cls._path_of(url)
        options = parse_qs(query, keep_blank_values=True)
        unknown = set(options) - {"fsync"}
        if unknown:
            raise ValueError(f"{url!r}: unknown option(s) {sorted(unknown)}; known: fsync")
        fsync = options.get("fsync", ["1"])[-1]
        if fsync not in ("0", "1", "true", "false"):
            raise ValueError(f"{url!r}: fsync must be 0 or 1, got {fsync!r}")
        return cls(os.path.expanduser(path), durable=fsync in ("1", "true"), url=url)

    @staticmethod
    def _path_of(url: str) -> tuple[str, str]:
        path, _, query = url.removeprefix("file://").partition("?")
        if not path:
            raise ValueError(f"file:// URL needs a path, e.g. file://./store: {url!r}")
        return path, query

    @classmethod
    def open_at(cls, url: str, *, create: bool = True) -> DirectoryBackend:
        # docstring inherited
        # every release made objects/ when it opened a folder; opening makes it too
        path = Path(os.path.expanduser(cls._path_of(url)[0]))
        if not create and not (path / "objects").is_dir():
            raise no_store(url)
        return cls.from_url(url)

    # -- objects -------------------------------------------------------------------------------
    def _object_path(self, key: bytes) -> Path:
        folder, name = object_path(key)
        return self._objects / folder / name

    def get(self, key: bytes) -> bytes:
        # docstring inherited
        try:
            with open(self._object_path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise KeyError(key) from None

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        # docstring inherited
        now = time.time()
        todo: dict[Path, bytes] = {}
        new = 0
        for key, data in items:
            target = self._object_path(key)
            if target in todo:
                continue
            held = self._freshen(target, data, now)
            if held is not True:
                todo[target] = data
                new += held is None
        self._writer.write(todo.items())
        return new

    @staticmethod
    def _freshen(target: Path, data: bytes, now: float) -> bool | None:
        """Whether ``target`` holds ``data`` (None: it is absent; False: it holds other
        bytes, a corrupt copy, which the caller writes over by rename); refresh its mtime
        if it is older than `FRESHEN_AFTER`. A copy is compared only when it is there,
        so a put of new objects costs one stat each, as before."""
        try:
            st = target.stat()
            if st.st_size != len(data) or target.read_bytes() != data:
                return False
            if now - st.st_mtime > FRESHEN_AFTER:
                os.utime(target)
        except FileNotFoundError:
            return None  # absent, or gc removed it between stat and utime: write it
        return True

    def contains(self, key: bytes) -> bool:
        # docstring inherited
        return self._object_path(key).is_file()

    def _folders(self, hex_prefix: str) -> list[str]:
        if len(hex_prefix) >= 2:
            return [hex_prefix[:2]]
        return sorted(
            d for d in os.listdir(self._objects) if len(d) == 2 and d.startswith(hex_prefix)
        )

    def _scan(self, hex_prefix: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
        rest = hex_prefix[2:]
        for folder in self._folders(hex_prefix):
            try:
                entries = sorted(os.scandir(self._objects / folder), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith(rest) and not entry.name.startswith(TMP_PREFIX):
                    yield folder, entry

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        # docstring inherited
        for folder, entry in self._scan(hex_prefix):
            key = key_of(folder, entry.name)
            if key is not None:
                yield key

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        # docstring inherited
        for folder, entry in self._scan():
            key = key_of(folder, entry.name)
            if key is None:
                continue
            try:
                yield key, entry.stat().st_mtime
            except FileNotFoundError:
                continue  # deleted while we listed

    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        # docstring inherited
        n = 0
        for key in keys:
            path = self._object_path(key)
            try:
                # a file system offers no transaction here: the window between this check
                # and the unlink is what FRESHEN_AFTER and gc's grace period cover
                if older_than is not None and path.stat().st_mtime >= older_than:
                    continue
                path.unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n

    def remove_orphans(self, older_than: float) -> int:
        """The temp files of killed writers (``.tmp-*``, never renamed into place) in every
        folder of the store, older than ``older_than``; return how many were removed."""
        folders = [self._refs, self._logs, self._names, self._objects]
        with contextlib.suppress(FileNotFoundError):
            folders += [Path(e.path) for e in os.scandir(self._objects) if e.is_dir()]
        n = 0
        for folder in folders:
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                if not entry.name.startswith(TMP_PREFIX):
                    continue
                try:
                    # a writer that is still at work has touched its file within the grace
                    if entry.stat(follow_symlinks=False).st_mtime < older_than:
                        os.unlink(entry.path)
                        n += 1
                except FileNotFoundError:
                    pass  # renamed into place or removed meanwhile
        return n

    # -- refs ----------------------------------------------------------------------------------
    def _ref_file(self, encoded: str) -> Path:
        return self._refs / encoded

    def _read_state(self, encoded: str) -> _RefState:
        path = self._ref_file(encoded)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return _RefState(None, 0)
        return _RefState.parse(text, path)

    def _name_of(self, encoded: str) -> str | None:
        name = decode_ref_name(encoded)
        if name is None:
            with contextlib.suppress(FileNotFoundError):
                name = (self._names / encoded).read_text()
        return name

    def ref_get(self, name: str) -> bytes | None:
        # docstring inherited
        return self._read_state(encode_ref_name(name)).value

    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        # docstring inherited
        encoded = encode_ref_name(name)
        with self._locked(name, encoded):
            state = self._read_state(encoded)
            if state.value != old:
                return False
            if encoded.startswith("~"):
                atomic_write(self._names / encoded, name.encode(), durable=self.durable)
            data = entry if isinstance(entry, bytes) else entry(self._last_entry(encoded, state))
            log_end = self._append_log(encoded, state.log_end, data)
            new_state = _RefState(None if new is None else bytes(new), log_end, state.log_end)
            atomic_write(self._ref_file(encoded), new_state.dump(), durable=self.durable)
            if self.durable:
                fsync_dir(self._refs)
            return True

    def _last_entry(self, encoded: str, state: _RefState) -> bytes | None:
        """The committed history's last entry (None when there is none), read from its
        offset when the ref file records it, else from the whole history."""
        if state.log_end == 0:
            return None
        try:
            with open(self._logs / encoded, "rb") as f:
                if state.last is None:
                    entries = parse_log(f.read(), state.log_end)
                    return entries[-1] if entries else None
                f.seek(state.last)
                data = f.read(state.log_end - state.last)
        except FileNotFoundError:
            return None  # a lost history, which fsck reports: it must not block the ref
        got = parse_log(data)
        return got[0] if len(got) == 1 else None

    def _append_log(self, encoded: str, log_end: int, entry: bytes) -> int:
        """Append ``entry`` after the committed history; return the new history length."""
        record = _LEN.pack(len(entry)) + bytes(entry)
        fd = os.open(self._logs / encoded, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            # bytes past log_end were written by a writer that died before committing
            os.ftruncate(fd, log_end)
            os.pwrite(fd, record, log_end)
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return log_end + len(record)

    @contextlib.contextmanager
    def _locked(self, name: str, encoded: str) -> Iterator[None]:
        lock = self._refs / f"{encoded}.lock"
        fd = self._acquire(name, lock)
        try:
            yield
        finally:
            mine = os.fstat(fd).st_ino
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                # only remove our own lock, not one that replaced it after ours was broken
                if os.stat(lock).st_ino == mine:
                    lock.unlink()

    def _acquire(self, name: str, lock: Path) -> int:
        """Take ``lock``; return an open descriptor of it (its inode says whose it is)."""
        deadline = time.monotonic() + LOCK_TIMEOUT
        delay = 0.0005
        holder = f"{os.getpid()} {self._host}\n".encode()
        while True:
            # the lock appears with its holder written (a hard link of a finished file), so a
            # writer killed as it takes the lock leaves one the next writer can judge, never
            # an empty one ("holder unknown", which only time may break)
            draft = lock.parent / f"{TMP_PREFIX}lock-{secrets.token_hex(6)}"
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, holder)
                os.link(draft, lock)
            except FileExistsError:
                os.close(fd)
            except BaseException:
                os.close(fd)
                raise
            else:
                crash_point("lock")
                return fd
            finally:
                draft.unlink()
            if self._break_if_stale(lock):
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ref {name!r} stayed locked for {LOCK_TIMEOUT:.0f} s by {lock}; "
                    "if no writer is running, delete that file"
                )
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.05)

    def _break_if_stale(self, lock: Path) -> bool:
        """Remove ``lock`` if its holder is gone; True when the lock may be free now.

        A dead holder's half-done update needs no repair: it never renamed the ref file,
        which is the commit point. The lock is renamed aside first so that of several
        waiters that judge it stale only one removes it, and never a fresh lock.
        """
        try:
            st = os.stat(lock)
            holder = lock.read_text().split()
        except FileNotFoundError:
            return True
        age = time.time() - st.st_mtime
        if len(holder) >= 2 and holder[1] == self._host and holder[0].isdigit():
            # a dead pid on this host cannot hold the lock; the short grace guards against
            # a holder in another pid namespace that shares our host name
            if pid_alive(int(holder[0])) or age < DEAD_HOLDER_GRACE:
                return False
        elif age < LOCK_STALE_AFTER:
            return False  # holder unknown (another host, or died before writing its pid)
        aside = lock.parent / f"{TMP_PREFIX}broken-{secrets.token_hex(6)}"
        try:
            os.rename(lock, aside)
        except FileNotFoundError:
            return True
        if os.stat(aside).st_ino != st.st_ino:
            # a new holder's lock replaced the stale one meanwhile: put it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, lock)
        aside.unlink()
        return True

    def _ref_files(self, prefix: str = "") -> list[tuple[str, str]]:
        """``(name, encoded)`` of every ref file whose name starts with ``prefix``, sorted."""
        out = []
        for encoded in os.listdir(self._refs):
            if encoded.startswith(TMP_PREFIX) or encoded.endswith(".lock"):
                continue
            name = self._name_of(encoded)
            if name is not None and name.startswith(prefix):
                out.append((name, encoded))
        out.sort()
        return out

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        # docstring inherited
        for name, encoded in self._ref_files(prefix):
            value = self._read_state(encoded).value
            if value is not None:
                yield name, value

    def ref_log(self, name: str) -> list[bytes]:
        # docstring inherited
        encoded = encode_ref_name(name)
        # the ref file first: it says how much of the log is committed
        end = self._read_state(encoded).log_end
        if end == 0:
            return []
        try:
            data = (self._logs / encoded).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{self._logs / encoded}: history of ref {name!r} is missing"
            ) from None
        entries = parse_log(data, end)
        if sum(map(len, entries)) + _LEN.size * len(entries) != end:
            # the committed history is whole by construction: a short read or an entry that
            # overruns the committed length is damage, not a writer that died mid-append
            raise ValueError(
                f"{self._logs / encoded}: history of ref {name!r} is damaged (its entries do "
                f"not fill the committed {end} bytes)"
            )
        return entries

    def ref_log_names(self) -> Iterator[str]:
        # docstring inherited
        for name, encoded in self._ref_files():
            if self._read_state(encoded).log_end > 0:
                yield name

    def close(self) -> None:
        # docstring inherited
        self._writer.close()
