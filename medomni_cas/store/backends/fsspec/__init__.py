"""Any fsspec filesystem as a backend: ``s3://bucket/prefix``, ``gs://…``, ``fsspec+<proto>://…``.

Layout under the root::

    packs/<name>.pack       small objects of one batch, concatenated (`_packfiles`)
    packs/<name>.idx        that pack's index: sorted keys, offsets, lengths, write times
                            (made again from the pack when it is damaged: `_packindex`)
    objects/ab/cdef…        loose objects, one per key: large ones (blob chunks), small
                            batches, and every object of stores written before packs
    refs/, logs/, names/    refs and their histories (`_refs`)
    medomni-store.json      written when the store is made (`MARKER`): a reader that
                            finds neither it nor a folder above says "no store at URL"

The parts, one concern each:

=================  ======================================================================
`_url`             URL, query options and s3 defaults -> the filesystem
`_remote`          batches of requests; the only code that knows async fsspec and s3fs
`_packindex`       the merged in-memory index of every pack
`_packfiles`       reading, writing and rewriting packs (gc, repack)
`_refs`            the ref protocol: two conditional writes per update
this module        `FsspecBackend`: which objects go loose or packed, presence, gc rules
=================  ======================================================================

Objects rely on whole-file writes being atomic, as on object stores. For a local folder
use ``file://`` (the directory backend), which writes through temp files.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from medomni_cas.store.backend import FRESHEN_AFTER, Backend, Entry, no_store
from medomni_cas.store.backends._layout import key_of, object_path
from medomni_cas.store.backends._packs import CorruptPack
from medomni_cas.store.backends.fsspec._packfiles import PACK_BYTES, PackFiles
from medomni_cas.store.backends.fsspec._packindex import PackIndexCache
from medomni_cas.store.backends.fsspec._refs import RefFiles
from medomni_cas.store.backends.fsspec._remote import Remote, has_conditional_writes, mtime
from medomni_cas.store.backends.fsspec._url import open_url

__all__ = ["LOOSE_SIZE", "MARKER", "PACK_MIN", "CorruptPack", "FsspecBackend"]

#: The file a store writes at its root when it is made, so that a reader tells an empty
#: store from a location that holds none (a mistyped prefix).
MARKER = "medomni-store.json"
MARKER_BYTES = b'{"medomni_store": 1}\n'
# what marks a store: the marker, or a folder that only a store written before it has
_STORE_NAMES = frozenset({MARKER, "packs", "objects", "refs", "logs", "names"})

#: Objects of at least this many bytes are stored loose, one file each (blob chunks).
LOOSE_SIZE = 256 * 1024
#: A batch with fewer small objects than this writes them loose (one request each) rather
#: than as a pack: two requests, and one more index for every reader to fetch.
PACK_MIN = 4
# Above this many fan-out folders, one listing of all objects is cheaper than one per folder.
FOLDER_LIMIT = 32
_FRESHEN_MS = int(FRESHEN_AFTER * 1000)


class FsspecBackend(Backend):
    """Objects (packed and loose) and refs on an fsspec filesystem.

    Writing. A remote store pays per request, so ``put_many`` writes a batch's small
    objects (under `LOOSE_SIZE`) as one pack and its index: N objects cost two requests.
    Objects of at least `LOOSE_SIZE`, and batches of fewer than `PACK_MIN` small objects,
    are written loose, concurrently, create-only where the filesystem has conditional
    writes (so no presence check is needed first).

    Reading. Packed keys are found in the merged pack index, refreshed when a key is not
    found, so that objects another writer packed are found too; loose ones by path.
    ``missing`` answers from the index and then checks loose objects in one batch (a
    request per key for a few keys, a listing for many). Stores written before packs
    existed are read as they are.

    Deleting (gc). ``older_than`` is checked against a fresh listing, and a key put again
    meanwhile is in a newer pack that gc did not list, so it survives; packed keys are
    deleted by rewriting their packs (`_packfiles`). Every batch of four or more small
    objects makes a pack, so a store written in many small batches gathers many packs;
    `repack` (``medomni cas repack``) merges the small ones, in the same safe order.

    Write times come from the writer's clock for packed objects (in the index; kept by
    rewrites) and from the server (``LastModified``) for loose ones.

    Refs. Without conditional writes (detected: see `_remote`) the backend sets
    ``supports_atomic_refs = False`` and the store refuses ref updates unless it was
    opened with ``single_writer=True`` (the explicit opt-in: you hold the only writer).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        conditional_writes: bool | None = None,
    ) -> None:
        self.url = url
        fs, root, asked = open_url(url, storage_options)
        if conditional_writes is None:
            conditional_writes = asked
        if conditional_writes is None:
            conditional_writes = has_conditional_writes(fs)
        self.fs = fs
        self.io = Remote(fs, root, url=url, conditional_writes=conditional_writes)
        self.root = self.io.root
        self.conditional_writes = conditional_writes
        self.supports_atomic_refs = conditional_writes
        self.index = PackIndexCache(self.io)
        self.packs = PackFiles(self.io, self.index)
        self.ref_files = RefFiles(self.io)
        # loose keys seen stored: no need to ask again (objects are immutable)
        self._loose_known: set[bytes] = set()

    @classmethod
    def from_url(cls, url: str) -> FsspecBackend:
        # docstring inherited
        return cls(url)

    @classmethod
    def open_at(cls, url: str, *, create: bool = True) -> FsspecBackend:
        # docstring inherited
        backend = cls(url)
        try:
            if not backend.holds_store():
                if not create:
                    raise no_store(url)
                backend.io.create(backend.io.path(MARKER), MARKER_BYTES)
        except BaseException:
            backend.close()
            raise
        return backend

    def holds_store(self) -> bool:
        """Whether a store is at the root: its `MARKER`, or (a store written before markers)
        one of its folders. One listing of the root; `OSError` naming the URL when the
        filesystem cannot be reached to answer."""
        try:
            names = set(self.io.child_names(self.root))
        except Exception as e:  # whatever the filesystem raises, the answer is unknown
            raise OSError(f"cannot reach the store at {self.url}: {e}") from e
        return bool(names & _STORE_NAMES)

    def refresh(self) -> None:
        """Re-list the packs: find what other writers packed, forget what gc removed."""
        self.index.refresh()

    # -- loose objects ---------------------------------------------------------------------
    def _object_path(self, key: bytes) -> str:
        return self.io.path("objects", *object_path(key))

    def _key_of_path(self, path: str) -> bytes | None:
        rel = path.rstrip("/").rsplit("/", 2)
        return key_of(rel[-2], rel[-1]) if len(rel) == 3 else None

    def _read_loose(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        out: dict[bytes, bytes] = {}
        paths = [self._object_path(k) for k in keys]
        for key, data in zip(keys, self.io.cat_whole(paths), strict=True):
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise OSError(f"{self.url}: reading object {key.hex()} failed: {data}") from data
            out[key] = data
            self._loose_known.add(key)
        return out

    def _loose_stamps(self, keys: list[bytes]) -> dict[bytes, float]:
        """Write times of those ``keys`` that are stored loose."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        wanted = set(keys)
        # one page tells all when the store holds under a page of loose objects (a packed
        # store); else a request per key, up to a listing's worth of them
        page = self.io.first_page(self.io.path("objects")) if len(keys) > 1 else None
        if page is not None and not page[1]:
            return self._stamps_in(page[0], wanted)
        if len(keys) <= self.io.per_key_limit:
            paths = [self._object_path(k) for k in keys]
            times = self.io.mtimes(paths)
            return {k: t for k, t in zip(keys, times, strict=True) if t is not None}
        folders = sorted({object_path(k)[0] for k in wanted})
        listings = (
            [self.io.path("objects")]
            if len(folders) > FOLDER_LIMIT
            else [self.io.path("objects", f) for f in folders]
        )
        out: dict[bytes, float] = {}
        for listing in listings:
            out.update(self._stamps_in(self.io.list(listing), wanted))
        return out

    def _stamps_in(
        self, listing: dict[str, dict[str, Any]], wanted: set[bytes]
    ) -> dict[bytes, float]:
        out: dict[bytes, float] = {}
        for path, info in listing.items():
            key = self._key_of_path(path)
            if key in wanted:
                out[key] = mtime(info)
        return out

    def _listed_loose(self, hex_prefix: str = "") -> Iterator[tuple[bytes, dict[str, Any]]]:
        objects = self.io.path("objects")
        found = self.io.list(
            self.io.path("objects", hex_prefix[:2]) if len(hex_prefix) >= 2 else objects
        )
        for path in sorted(found):
            key = self._key_of_path(path)
            if key is not None and key.hex().startswith(hex_prefix):
                yield key, found[path]

    # -- objects: reading ------------------------------------------------------------------
    def get(self, key: bytes) -> bytes:
        # docstring inherited
        data = next(self.get_many([key]))[1]
        if data is None:
            raise KeyError(key)
        return data

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        # docstring inherited
        keys = list(keys)
        if not keys:
            return iter(())
        asked = time.monotonic()
        self.index.ensure()
        unique = list(dict.fromkeys(keys))
        found, gone = self.packs.read(unique)
        found.update(self._read_loose([k for k in unique if k not in found and k not in gone]))
        if gone or (len(found) < len(unique) and (self.index.refreshed_at or 0) < asked):
            # packed by another writer since our listing, or moved by gc: look again
            self.index.refresh()
            again, gone = self.packs.read(k for k in unique if k not in found)
            if gone:
                loc = self.index.where.get(gone[0])
                path = self.index.pack_path(loc[0] if loc else "?", "pack")
                raise CorruptPack(path, "the pack is listed by its index but cannot be read")
            found.update(again)
        return iter([(k, found.get(k)) for k in keys])

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        # docstring inherited
        keys = list(keys)
        if not keys:
            return []
        asked = time.monotonic()
        self.index.ensure()
        loose = self._loose_known
        absent = [k for k in dict.fromkeys(keys) if k not in self.index.where and k not in loose]
        if absent and (self.index.refreshed_at or 0) < asked:
            self.index.refresh()
            absent = [k for k in absent if k not in self.index.where]
        if absent:
            self._loose_known.update(self._loose_stamps(absent))
        where, loose = self.index.where, self._loose_known
        return [k for k in keys if k not in where and k not in loose]

    def contains(self, key: bytes) -> bool:
        # docstring inherited
        return not self.missing([key])

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        # docstring inherited
        self.index.refresh()
        keys = self.index.keys(hex_prefix)
        keys.update(k for k, _ in self._listed_loose(hex_prefix))
        return iter(sorted(keys))

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        # docstring inherited
        self.index.refresh()
        stamps = self.index.stamps()
        for key, info in self._listed_loose():
            stamps[key] = max(stamps.get(key, 0.0), mtime(info))
        return iter(list(stamps.items()))

    # -- objects: writing ------------------------------------------------------------------
    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Store each absent ``(key, data)``: a pack for many small ones, loose otherwise.

        Presence is judged from the pack index this backend holds and the loose objects it
        has seen, with no request: a small object that exists only loose and unseen, or
        in a pack written since the last listing, is stored again (harmless: reads take
        either copy) and counted as new. A key present with a write time older than
        `FRESHEN_AFTER` is written again, so that gc's grace period counts from now.

        A stored copy that is not the bytes put (which hash to the key: a corrupt copy) is
        replaced: a packed one by a new pack (the newest copy of a key is the one read), a
        loose one by a plain write. Stored copies are read for this only when the key is
        present (no request for new objects), and a packed one only when its length
        matches (a different length is seen in the index).
        """
        batch: dict[bytes, bytes] = {}
        for key, data in items:
            batch.setdefault(bytes(key), data)
        if not batch:
            return 0
        self.index.ensure()
        now_ms = time.time_ns() // 1_000_000
        where = self.index.where
        present = {k for k in batch if k in where}
        small: list[tuple[bytes, bytes]] = []
        large: list[tuple[bytes, bytes]] = []
        packed: list[bytes] = []  # present, fresh: compared with what is stored
        forced: list[tuple[bytes, bytes]] = []  # a corrupt packed copy: packed again
        for key, data in batch.items():
            loc = where.get(key)
            if loc is not None:
                if now_ms - loc[3] > _FRESHEN_MS:
                    small.append((key, data))  # packed, so small: pack it again, fresh
                elif loc[2] != len(data):
                    forced.append((key, data))
                else:
                    packed.append(key)
            elif len(data) >= LOOSE_SIZE or key in self._loose_known:
                large.append((key, data))  # the loose path checks presence and freshness
            else:
                small.append((key, data))
        if packed:
            stored, _ = self.packs.read(packed)
            forced += [(k, batch[k]) for k in packed if k in stored and stored[k] != batch[k]]
        if len(small) < PACK_MIN:
            large.extend(small)
            small = []
        absent = self._put_loose(large)
        self.packs.write(small, now_ms)
        if forced:
            # newer than the copy it replaces, even one written this very millisecond
            self.packs.write(forced, max(now_ms, *(where[k][3] + 1 for k, _ in forced)))
        return len(absent - present) + sum(1 for k, _ in small if k not in present)

    def visible_together(self, sizes: Sequence[int]) -> bool:
        # docstring inherited: a batch of small objects is one pack, seen once its index is
        return len(sizes) >= PACK_MIN and max(sizes) < LOOSE_SIZE

    def _put_loose(self, items: list[tuple[bytes, bytes]]) -> set[bytes]:
        """Write loose objects that are absent (or stale); return the keys that were absent."""
        if not items:
            return set()
        now = time.time()
        paths = [(self._object_path(k), bytes(d)) for k, d in items]
        if self.conditional_writes:
            written = self.io.pipe_many(paths, create=True)
            existed = [k for (k, _), ok in zip(items, written, strict=True) if not ok]
            stamps = self._loose_stamps(existed) if existed else {}
            # rewrite the stale, and any whose "precondition failed" (s3fs may report other
            # errors the same way) left nothing there: a plain write of the same bytes;
            # and a stored copy that is not these bytes (corrupt)
            redo = {k for k in existed if k not in stamps or now - stamps[k] > FRESHEN_AFTER}
            redo |= self._differ([(k, d) for k, d in items if k in stamps and k not in redo])
            self.io.pipe_many([p for (k, _), p in zip(items, paths, strict=True) if k in redo])
            absent = {k for (k, _), ok in zip(items, written, strict=True) if ok}
            absent.update(k for k in existed if k not in stamps)
        else:
            stamps = self._loose_stamps([k for k, _ in items])
            corrupt = self._differ([(k, d) for k, d in items if k in stamps])
            todo = [
                p
                for (k, _), p in zip(items, paths, strict=True)
                if k not in stamps or now - stamps[k] > FRESHEN_AFTER or k in corrupt
            ]
            self.io.pipe_many(todo)
            absent = {k for k, _ in items if k not in stamps}
        self._loose_known.update(k for k, _ in items)
        return absent

    def _differ(self, items: list[tuple[bytes, bytes]]) -> set[bytes]:
        """The keys of ``items`` stored loose with other bytes than theirs (corrupt)."""
        stored = self._read_loose([k for k, _ in items])
        return {k for k, d in items if k in stored and stored[k] != d}

    # -- objects: deleting (gc) ------------------------------------------------------------
    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        # docstring inherited
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        if not keys:
            return 0
        self.index.refresh()  # a fresh view: a key put again since gc listed it must be seen
        limit_ms = None if older_than is None else older_than * 1000.0
        where = self.index.where
        # where holds the newest copy's time: one fresh copy keeps every copy
        packed = {k for k in keys if k in where}
        doomed = {k for k in packed if limit_ms is None or where[k][3] < limit_ms}
        loose = self._loose_stamps([k for k in keys if k not in packed or k in doomed])
        loose_doomed = {k for k, t in loose.items() if older_than is None or t < older_than}
        doomed -= set(loose) - loose_doomed  # a fresh loose copy keeps the packed ones
        loose_doomed -= packed - doomed  # and a fresh packed copy keeps the loose one
        if doomed:
            self.packs.drop(doomed)
        if loose_doomed:
            self.io.rm([self._object_path(k) for k in loose_doomed])
            self._loose_known.difference_update(loose_doomed)
        return len(doomed | loose_doomed)

    def repack(self, *, small: int = PACK_BYTES // 4) -> int:
        """Merge every pack under ``small`` bytes into packs of up to `PACK_BYTES` (a store
        written in many small batches has many packs, and a cold reader fetches each
        index); return how many packs were merged away. Safe alongside readers, writers
        and gc, as gc's rewrites are: new packs first, then the old indexes and packs."""
        return self.packs.repack(small)

    def remove_orphans(self, older_than: float) -> int:
        """Pack files without an index (a writer or gc died between the two), older than
        ``older_than``."""
        return self.packs.remove_orphans(older_than)

    def damage(self) -> list[tuple[str, str]]:
        """Pack indexes found damaged: rebuilt from their packs, or left out (their pack
        is gone or damaged too: their objects are missing)."""
        return sorted(self.index.damaged.items())

    # -- refs ------------------------------------------------------------------------------
    def ref_get(self, name: str) -> bytes | None:
        # docstring inherited
        return self.ref_files.get(name)

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        # docstring inherited
        return self.ref_files.get_many(names)

    def ref_get_prefixed(self, prefix: str, ids: Sequence[bytes]) -> list[bytes | None]:
        # docstring inherited
        return self.ref_files.get_prefixed(prefix, ids)

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        # docstring inherited
        return self.ref_files.iter(prefix)

    def ref_log(self, name: str) -> list[bytes]:
        # docstring inherited
        return self.ref_files.log(name)

    def ref_log_names(self) -> Iterator[str]:
        # docstring inherited
        return self.ref_files.log_names()

    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        # docstring inherited
        return self.ref_files.update(name, old, new, entry)
