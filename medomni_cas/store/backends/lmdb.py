"""The embedded default backend: one LMDB environment, with large objects in files beside it.

Layout of ``PATH/``: ``data.mdb`` and ``lock.mdb`` (LMDB), and ``large/ab/cdef…`` for objects
of at least ``LARGE_OBJECT`` bytes. LMDB keeps every dirty page of a write transaction in
memory, so a 1 GiB blob written through it would need 1 GiB of RAM; chunk files written with
temp-file-then-rename and fsync keep memory bounded and stream at the disk's own rate (see
benchmarks_perf/RESULTS.md). The LMDB entry of a large object is a marker, written only after
its file is durable, so a crash leaves at most an orphan file that gc removes.

Every object value starts with a 9-byte header: a flag (0 inline, 1 in a file) and the
write time in ms, little-endian.

Size. The map grows by doubling when full, without bound unless the URL sets one:
``lmdb://PATH?max_size=BYTES`` (a quota). A write that would pass it, like one that meets a
full disk, fails whole (`EnvironmentFailure`, after LMDB aborted its transaction), so the
store keeps what it held.

Sharing. Several processes may open one environment at once: LMDB serialises writers with
its lock file; the map grows by doubling when full, and a process that finds the map
grown by another adopts the new size. Within one process, every backend on a path shares
one environment (`_lmdbenv`), so that a path can be opened again while it is open (a
notebook re-run, a view over the workspace's store); closing the last one closes it.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from binascii import hexlify
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Literal, TypeVar, cast, overload
from urllib.parse import parse_qs

import lmdb

from medomni_cas.errors import EnvironmentFailure
from medomni_cas.store import _mapped
from medomni_cas.store.backend import FRESHEN_AFTER, Backend, Entry, no_store
from medomni_cas.store.backends._layout import key_of, object_path
from medomni_cas.store.backends._lmdbenv import acquire
from medomni_cas.store.files import TMP_PREFIX, FileWriter

__all__ = ["LARGE_OBJECT", "LMDBBackend"]

LARGE_OBJECT = 256 * 1024
_HDR = struct.Struct("<BQ")
_INLINE, _FILE = 0, 1
_FIRST = itemgetter(0)  # a value's flag byte; a listed pair's key
_SECOND = itemgetter(1)  # a listed pair's value
_DATA = itemgetter(slice(_HDR.size, None))  # an inline value's object bytes
FRESHEN_AFTER_MS = int(FRESHEN_AFTER * 1000)
_INITIAL_MAP = 1 << 30
#: Keys a listing reads per read transaction (`LMDBBackend._listing`).
_LIST_CHUNK = 16_384
_NOTE_EVERY = 256  # keys read by get_list between two looks at the mapped pages
T = TypeVar("T")


def _inline(values: list[bytes | None]) -> list[bytes | None] | None:
    """The object bytes of stored values when every one is present and inline (C-level
    passes: a flag check, a header cut), else None."""
    if None in values:
        return None
    found = cast("list[bytes]", values)
    flags = bytes(map(_FIRST, found))
    return list(map(_DATA, found)) if flags.count(_INLINE) == len(flags) else None


def _log_entries(cur: lmdb.Cursor[bytes], key: bytes) -> list[bytes]:
    """The history entries of the ref named ``key``, oldest first, by ``cur`` (on the
    histories' database): their keys are the name, a 0 byte and an 8-byte number."""
    head = key + b"\x00"
    out: list[bytes] = []
    if cur.set_range(head):
        for k, value in cur:
            if not k.startswith(head):
                break
            if len(k) == len(head) + 8:
                out.append(value)
    return out


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LMDBBackend(Backend):
    """Objects and refs in an LMDB environment, large objects in files (``lmdb://PATH``)."""

    # a write transaction's dirty pages are held in memory until it commits: a bulk copy
    # of random ids dirties about a page (4 KiB) per object
    write_batch_items = 4096
    lists_in_key_order = True  # its listings are cursors over a B-tree

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = True,
        map_size: int = _INITIAL_MAP,
        max_size: int | None = None,
        url: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.url = url or f"lmdb://{self.path}"
        self.durable = durable
        self.max_size = max_size
        if max_size is not None:
            map_size = min(map_size, max_size)
        self._writer = FileWriter(durable=durable)
        self._large = self.path / "large"
        # shared with every other backend of this process on the same path (`_lmdbenv`)
        self._shared = acquire(self.path, durable=durable, map_size=map_size)
        self._flush = durable and not self._shared.durable
        self.env = self._shared.env
        self._objects = self._shared.objects
        self._refs = self._shared.refs
        self._reflog = self._shared.reflog
        self._closed = False
        # its pages read are given back past a budget (`medomni_cas.store._mapped.note`)
        _mapped.watch(self.path / "data.mdb")

    @classmethod
    def from_url(cls, url: str) -> LMDBBackend:
        # docstring inherited
        path, _, query = url.removeprefix("lmdb://").partition("?")
        if not path:
            raise ValueError("lmdb:// URL needs a path, e.g. lmdb://./.medomni/store")
        given = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if set(given) - {"max_size"}:
            raise ValueError(f"{url!r}: unknown option(s) {sorted(set(given) - {'max_size'})}")
        max_size = None
        if "max_size" in given:
            if not given["max_size"].isdigit() or int(given["max_size"]) < 1 << 16:
                raise ValueError(f"{url!r}: max_size must be a number of bytes, at least 65536")
            max_size = int(given["max_size"])
        return cls(path, url=url, max_size=max_size)

    @classmethod
    def open_at(cls, url: str, *, create: bool = True) -> LMDBBackend:
        # docstring inherited
        # opening the environment creates it: look for its data file first
        path = Path(url.removeprefix("lmdb://").split("?", 1)[0]).expanduser()
        if not create and not (path / "data.mdb").is_file():
            raise no_store(url)
        return cls.from_url(url)

    def reader_url(self) -> str:
        # docstring inherited
        # LMDB is made for readers in several processes; absolute: a helper's cwd may differ
        return f"lmdb://{self.path.resolve()}"

    # -- transactions that survive a full or grown map ---------------------------------------
    def _write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        for _ in range(64):
            try:
                with self.env.begin(write=True) as txn:
                    result = fn(txn)
                # a write reads the pages it changes through the map: looked at after
                # each (a delete of a batch of ids maps a page and its neighbours per id)
                _mapped.note(_NOTE_EVERY)
                if self._flush:
                    # the environment was opened without sync by a less careful holder
                    self.env.sync(True)
                return result
            except lmdb.MapFullError:
                size = self.env.info()["map_size"]
                if self.max_size is not None and size >= self.max_size:
                    raise EnvironmentFailure(
                        f"store {self.url} is full: its LMDB map reached max_size "
                        f"({self.max_size} bytes) and the write was not made"
                    ) from None
                grown = size * 2 if self.max_size is None else min(size * 2, self.max_size)
                self.env.set_mapsize(grown)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)  # adopt the size another process grew the map to
        raise EnvironmentFailure(f"store {self.url}: its LMDB map could not be grown")

    @overload
    def _read(
        self, db: lmdb._Database | None = None, *, buffers: Literal[True] = ...
    ) -> lmdb.Transaction[memoryview]: ...
    @overload
    def _read(
        self, db: lmdb._Database | None = None, *, buffers: Literal[False]
    ) -> lmdb.Transaction[bytes]: ...
    def _read(
        self, db: lmdb._Database | None = None, *, buffers: bool = True
    ) -> lmdb.Transaction[memoryview] | lmdb.Transaction[bytes]:
        _mapped.note(1)  # a read: its pages given back past a budget
        for _ in range(64):
            try:
                if buffers:
                    return self.env.begin(db=db, buffers=True)
                return self.env.begin(db=db, buffers=False)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)  # another process grew the map (maybe again)
        raise RuntimeError(f"{self.url}: LMDB map keeps being resized by another process")

    def _file(self, key: bytes) -> Path:
        folder, name = object_path(key)
        return self._large / folder / name

    def _write_files(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write large objects to their files, durably, before any marker is committed."""
        self._writer.write((self._file(key), data) for key, data in items)

    # -- objects -------------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes:
        # docstring inherited
        with self._read() as txn:
            value = txn.get(key, db=self._objects)
            if value is None:
                raise KeyError(key)
            if value[0] == _INLINE:
                return bytes(value[_HDR.size :])
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        # docstring inherited
        keys = list(keys)
        out: list[tuple[bytes, bytes | None]] = []
        large: list[int] = []
        with self._read() as txn:
            get = txn.get
            db = self._objects
            for key in keys:
                value = get(key, db=db)
                if value is None:
                    out.append((key, None))
                elif value[0] == _INLINE:
                    out.append((key, bytes(value[_HDR.size :])))
                else:
                    large.append(len(out))
                    out.append((key, None))
        for i in large:
            key = out[i][0]
            with contextlib.suppress(FileNotFoundError):
                out[i] = (key, self._file(key).read_bytes())
        return iter(out)

    def get_list(self, keys: Sequence[bytes]) -> list[bytes | None]:
        # docstring inherited
        if len(keys) > _NOTE_EVERY:  # a part's stored values (a copy) freed before the next
            out: list[bytes | None] = []
            for i in range(0, len(keys), _NOTE_EVERY):
                out += self.get_list(keys[i : i + _NOTE_EVERY])
            return out
        values = self._stored(keys)
        inline = _inline(values)
        if inline is not None:
            return inline
        return [self._value(key, value) for key, value in zip(keys, values, strict=True)]

    def get_parts(
        self, keys: Sequence[bytes], held_bytes: int
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        # docstring inherited; exact here: a large object's marker says it is one, so its
        # file is read only when the part before it has been taken
        values = self._stored(keys)
        if not values:
            return
        inline = _inline(values)
        if inline is not None and sum(map(len, cast("list[bytes]", values))) <= held_bytes:
            yield list(keys), inline
            return
        yield from self._cut(zip(keys, values, strict=True), held_bytes, len(keys))

    def _cut(
        self, stored: Iterable[tuple[bytes, bytes | None]], held_bytes: int, size: int
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """The keys and bytes of ``stored`` values (header and bytes, or a large object's
        marker; None: absent) in parts of at most ``size`` keys holding about
        ``held_bytes``; a large object's file is read only when the part before it has
        been taken."""
        part: list[bytes] = []
        got: list[bytes | None] = []
        held = 0
        for key, value in stored:
            large = value is not None and value[0] != _INLINE  # of LARGE_OBJECT bytes at least
            if part and (
                len(part) >= size
                or held >= held_bytes
                or (large and held + LARGE_OBJECT > held_bytes)
            ):
                yield part, got
                part, got, held = [], [], 0
            data = self._value(key, value)
            part.append(key)
            got.append(data)
            held += len(data) if data else 0
        if part:
            yield part, got

    def _stored(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored value of each key (header and bytes, or a large object's marker)."""
        if len(keys) > _NOTE_EVERY:  # the mapped pages looked at between parts
            # read in key order, given back in the order asked: neighbouring keys share
            # B-tree pages, each faulted once, not once per key after a drop of mapped pages
            order = sorted(range(len(keys)), key=keys.__getitem__)
            ordered = itemgetter(*order)(keys)
            out: list[bytes | None] = []
            for i in range(0, len(keys), _NOTE_EVERY):
                out += self._stored(ordered[i : i + _NOTE_EVERY])
            back = sorted(range(len(keys)), key=order.__getitem__)
            return list(itemgetter(*back)(out))
        # one C-level pass per step (get, flag check, header cut) instead of a Python loop
        # per key: a walk's reads cost about what raw txn.get costs
        with self._read(self._objects, buffers=False) as txn:
            get: Callable[[bytes], bytes | None] = txn.get  # the overload map can take
            values = list(map(get, keys))
        _mapped.note(len(keys))
        return values

    def _value(self, key: bytes, value: bytes | None) -> bytes | None:
        if value is None:
            return None
        if value[0] == _INLINE:
            return value[_HDR.size :]
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            return None

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        # docstring inherited
        items = list(items)
        if not items:
            return 0
        now = _now_ms()
        inline = _HDR.pack(_INLINE, now)
        large = [(k, d) for k, d in items if len(d) >= LARGE_OBJECT]
        if large:
            absent = set(self.missing(k for k, _ in large))
            # a stored file that differs from the bytes put (which hash to the key) is
            # corrupt: written again, by rename, like an absent one
            self._write_files(
                [(k, d) for k, d in large if k in absent or not self._file_holds(k, d)]
            )
        marker = _HDR.pack(_FILE, now)
        pairs = [(k, marker if len(d) >= LARGE_OBJECT else inline + d) for k, d in items]

        def put(txn: lmdb.Transaction) -> int:
            cur = txn.cursor(self._objects)
            consumed, added = cur.putmulti(pairs, dupdata=False, overwrite=False)
            if added < consumed:
                self._freshen(cur, pairs, now)
            return added

        return self._write(put)

    def _file_holds(self, key: bytes, data: bytes) -> bool:
        try:
            path = self._file(key)
            return path.stat().st_size == len(data) and path.read_bytes() == data
        except FileNotFoundError:
            return False

    def _freshen(self, cur: lmdb.Cursor, pairs: list[tuple[bytes, bytes]], now: int) -> None:
        """Refresh old write times of keys put again, and replace a stored value that is
        not the one put: the stored bytes are read here anyway, so a corrupt copy costs one
        comparison to find (the bytes put hash to the key: they are the object)."""
        for key, new in pairs:
            value = cur.get(key)
            if value is None:
                continue
            flag, stamp = _HDR.unpack_from(value)
            if flag != new[0] or (flag == _INLINE and value[_HDR.size :] != new[_HDR.size :]):
                cur.put(key, new)  # corrupt (or a marker where the object is inline)
            elif now - stamp > FRESHEN_AFTER_MS:
                cur.put(key, _HDR.pack(flag, now) + value[_HDR.size :])

    def contains(self, key: bytes) -> bool:
        # docstring inherited
        with self._read() as txn:
            return txn.get(key, db=self._objects) is not None

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        # docstring inherited
        keys = list(keys)
        out: list[bytes] = []
        for i in range(0, len(keys), _NOTE_EVERY):
            with self._read() as txn:
                get = txn.get
                db = self._objects
                out += [k for k in keys[i : i + _NOTE_EVERY] if get(k, db=db) is None]
            _mapped.note(_NOTE_EVERY)
        return out

    # Listings are materialised so that no read transaction stays open while the caller
    # writes (gc deletes while it walks).
    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        # docstring inherited
        start = bytes.fromhex(hex_prefix[: len(hex_prefix) // 2 * 2])
        for chunk in self._listing(self._objects, start, values=False):
            for key, _ in chunk:
                if not key.startswith(start):
                    return
                if key.hex().startswith(hex_prefix):
                    yield key

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        # docstring inherited
        unpack = _HDR.unpack_from
        for chunk in self._listing(self._objects, b"", values=True):
            for key, value in chunk:
                yield key, unpack(value)[1] / 1000.0

    def iter_parts(
        self, held_bytes: int, size: int = 4096
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        # docstring inherited; keys and bytes from one cursor: each B-tree leaf is mapped
        # once, where a listing then a read maps it twice, and past the mapped budget
        # (`_mapped`) faults it twice (the leaves of keys in order lie anywhere in the file)
        for keys, values, _ in self._parts(held_bytes, size, stamps=False):
            yield keys, values

    def iter_stamped_parts(
        self, held_bytes: int, size: int = 4096
    ) -> Iterator[tuple[list[bytes], list[bytes | None], list[float]]]:
        # docstring inherited; from the same cursor as `iter_parts`: a value's header holds
        # its write time
        return self._parts(held_bytes, size, stamps=True)

    def _parts(
        self, held_bytes: int, size: int, *, stamps: bool
    ) -> Iterator[tuple[list[bytes], list[bytes | None], list[float]]]:
        """Every key, its bytes and (with ``stamps``, else none) its write time, in parts
        (`iter_parts`)."""
        when: list[float] = []
        for chunk in self._listing(self._objects, b"", values=True):
            keys = list(map(_FIRST, chunk))
            values: list[bytes | None] = list(map(_SECOND, chunk))
            if stamps:
                when = [ms / 1000.0 for _, ms in map(_HDR.unpack_from, cast("list[bytes]", values))]
            for i in range(0, len(keys), size):
                # a part at a time: one large object sends its own part the slow way only
                part = _inline(values[i : i + size])
                if part is not None and sum(map(len, cast("list[bytes]", part))) <= held_bytes:
                    yield keys[i : i + size], part, when[i : i + size]  # C-level passes
                    continue
                stored = zip(keys[i : i + size], values[i : i + size], strict=True)
                at = i
                for got_keys, got in self._cut(stored, held_bytes, size):
                    yield got_keys, got, when[at : at + len(got_keys)]
                    at += len(got_keys)

    def _listing(
        self, db: lmdb._Database, start: bytes, *, values: bool
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """The keys (and values) of ``db`` from ``start`` on, in key order, `_LIST_CHUNK` at a
        time, each chunk read in a read transaction of its own and held alone: a listing
        never holds every key, nor a read transaction while its caller works (which would
        keep LMDB from reusing pages). A key written meanwhile may or may not be listed."""
        after: bytes | None = None
        while True:
            chunk: list[tuple[bytes, bytes]] = []
            with self._read(buffers=False) as txn:
                cur = txn.cursor(db)
                if not cur.set_range(start if after is None else after):
                    return
                if after is not None and cur.key() == after and not cur.next():
                    return
                # the mapped pages looked at every `_NOTE_EVERY` keys: the leaves of keys
                # in order lie anywhere in the file, each mapped with its neighbours; a
                # C-level pass per part (the pairs come as bytes, copied by LMDB's binding)
                pairs: Iterator[tuple[bytes, bytes]] = (
                    cur.iternext(keys=True, values=True)
                    if values
                    else zip(cur.iternext(keys=True, values=False), repeat(b""))
                )
                while len(chunk) < _LIST_CHUNK:
                    part = list(islice(pairs, _NOTE_EVERY))
                    chunk += part
                    _mapped.note(len(part))
                    if len(part) < _NOTE_EVERY:
                        break
            if not chunk:
                return
            yield chunk
            if len(chunk) < _LIST_CHUNK:
                return
            after = chunk[-1][0]

    def drop_pages(self) -> None:
        """Give back the pages of the data file this process has read (its RSS); they stay
        in the page cache (`medomni_cas.store._mapped`)."""
        _mapped.drop(self.path / "data.mdb")

    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        # docstring inherited
        keys = list(keys)
        limit = None if older_than is None else older_than * 1000.0

        def delete(txn: lmdb.Transaction) -> list[tuple[bytes, int]]:
            gone = []
            for n, key in enumerate(keys, 1):
                if n % _NOTE_EVERY == 0:
                    _mapped.note(_NOTE_EVERY)  # the pages read, looked at as it goes
                value = txn.get(key, db=self._objects)
                if value is None:
                    continue
                flag, stamp = _HDR.unpack_from(value)
                # checked inside the write transaction: no writer can refresh it meanwhile
                if limit is not None and stamp >= limit:
                    continue
                if txn.delete(key, db=self._objects):
                    gone.append((key, flag))
            return gone

        gone = self._write(delete)
        for key, flag in gone:
            if flag == _FILE:
                self._file(key).unlink(missing_ok=True)
        return len(gone)

    def remove_orphans(self, older_than: float) -> int:
        """Chunk files with no LMDB entry (a writer died between file and entry), and
        temp files, older than ``older_than``."""
        if not self._large.is_dir():
            return 0
        candidates: list[tuple[Path, bytes | None]] = []
        for sub in self._large.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.startswith(TMP_PREFIX):
                    candidates.append((f, None))
                else:
                    key = key_of(sub.name, f.name)
                    if key is not None:
                        candidates.append((f, key))
        absent = set(self.missing(k for _, k in candidates if k is not None))
        n = 0
        for f, key in candidates:
            if key is not None and key not in absent:
                continue
            try:
                if f.stat().st_mtime < older_than:
                    f.unlink()
                    n += 1
            except FileNotFoundError:
                pass
        return n

    # -- refs ----------------------------------------------------------------------------------
    def ref_get(self, name: str) -> bytes | None:
        # docstring inherited
        with self._read() as txn:
            value = txn.get(name.encode(), db=self._refs)
            return None if value is None else bytes(value)

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        # docstring inherited
        keys = list(map(str.encode, names))
        # one read transaction; values as bytes, not buffers: for 32-byte values a buffer
        # costs more than the copy it saves
        with self._read(self._refs, buffers=False) as txn:
            get: Callable[[bytes], bytes | None] = txn.get  # the overload map can take
            return list(map(get, keys))

    def ref_get_prefixed(self, prefix: str, ids: Sequence[bytes]) -> list[bytes | None]:
        # docstring inherited
        # the keys made as bytes from the ids (no str names to make and encode); one read
        # transaction, values as bytes (see ref_get_many)
        start = prefix.encode()
        keys = list(map(start.__add__, map(hexlify, ids)))
        with self._read(self._refs, buffers=False) as txn:
            # no ref under the prefix (a store whose runs are recorded in chunk tables has
            # no slot refs): one seek answers, not a B-tree descent per id
            cur = txn.cursor(self._refs)
            if not cur.set_range(start) or not cur.key().startswith(start):
                return [None] * len(keys)
            get: Callable[[bytes], bytes | None] = txn.get  # the overload map can take
            return list(map(get, keys))

    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        # docstring inherited
        key = name.encode()

        def update(txn: lmdb.Transaction) -> bool:
            current = txn.get(key, db=self._refs)
            if (None if current is None else bytes(current)) != old:
                return False
            if new is None:
                txn.delete(key, db=self._refs)
            else:
                txn.put(key, bytes(new), db=self._refs)
            cur = txn.cursor(self._reflog)
            last = self._last_seq(cur, key)
            if isinstance(entry, bytes):
                data = entry
            else:  # the cursor sits on the last entry when there is one
                data = entry(bytes(cur.value()) if last else None)
            txn.put(key + b"\x00" + (last + 1).to_bytes(8, "big"), data, db=self._reflog)
            return True

        return self._write(update)

    @staticmethod
    def _last_seq(cur: lmdb.Cursor, key: bytes) -> int:
        head = key + b"\x00"
        if cur.set_range(key + b"\x01"):
            if not cur.prev():
                return 0
        elif not cur.last():
            return 0
        k = bytes(cur.key())
        if k.startswith(head) and len(k) == len(head) + 8:
            return int.from_bytes(k[len(head) :], "big")
        return 0

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        # docstring inherited
        start = prefix.encode()
        for chunk in self._listing(self._refs, start, values=True):
            for key, value in chunk:
                if not key.startswith(start):
                    return
                yield key.decode(), value

    def ref_log(self, name: str) -> list[bytes]:
        # docstring inherited
        with self._read(buffers=False) as txn:
            return _log_entries(txn.cursor(self._reflog), name.encode())

    def ref_histories(self, names: Sequence[str]) -> list[tuple[list[bytes], bytes | None]]:
        # docstring inherited; one read transaction (one snapshot: a ref and its history
        # agree), the history's cursor moving on when the names come sorted
        out: list[tuple[list[bytes], bytes | None]] = []
        with self._read(buffers=False) as txn:
            cur = txn.cursor(self._reflog)
            for name in names:
                key = name.encode()
                out.append((_log_entries(cur, key), txn.get(key, db=self._refs)))
                if len(out) % _NOTE_EVERY == 0:  # a look at the mapped pages, as a read's
                    _mapped.note(_NOTE_EVERY)
        return out

    def ref_log_names(self) -> Iterator[str]:
        # docstring inherited
        last = ""
        for chunk in self._listing(self._reflog, b"", values=False):
            for key, _ in chunk:
                name = key[:-9].decode()
                if name != last:
                    yield name
                    last = name

    def close(self) -> None:
        # docstring inherited
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        self._shared.release()
        _mapped.unwatch(self.path / "data.mdb")
