"""Any fsspec filesystem as a backend: ``s3://bucket/prefix``, ``gs://…``, ``fsspec+<proto>://…``.

Layout under the root::

    packs/<name>.pack       small objects of one batch, concatenated (see `_packs`)
    packs/<name>.idx        that pack's index: sorted keys, offsets, lengths, write times
    objects/ab/cdef…        loose objects, one per key: large ones (blob chunks), small
                            batches, and every object of stores written before packs
    refs/<name>             "<hex id or ->\\n<seq>\\n": the ref and the number of its updates
    logs/<name>/<seq:020d>  update number seq: "<new hex id or ->\\n" + the history entry
    names/~<hash>           the full name of a ref whose encoded name is too long

Objects. A remote store pays per request, so ``put_many`` writes a batch's small objects
(under `LOOSE_SIZE`) as one pack and its index: N objects cost two requests. Objects of at
least `LOOSE_SIZE`, and batches of fewer than `PACK_MIN` small objects, are written loose,
concurrently, create-only where the filesystem has conditional writes (so no presence
check is needed first). Reads keep an in-memory index of every pack, merged from the
``.idx`` files: loaded on first use (one listing of ``packs/``, then the new indexes,
concurrently) and refreshed when a key is not found, so objects another writer packed
are found too. Packed objects are read with byte ranges, neighbours in one pack merged
into one request (gaps up to `RANGE_GAP`), many requests in flight at once through the
filesystem's async API where it has one. Every read passes a range or, for whole loose
objects on s3, ``max_concurrency=1``: otherwise s3fs sends a HEAD before each GET to
size it. ``missing`` answers from the index and then checks loose objects in one batch
(a HEAD per key for a few keys, a listing for many). Listings on s3 are one
``ListObjectsV2`` request per 1,000 keys (s3fs's own ``find`` adds a HEAD when a prefix
is empty). Stores written before packs existed are read as they are.

Deleting (gc). A packed key is deleted by rewriting its pack without it: the survivors,
with their write times, go into a new pack and index first; only then are the old
index and pack removed. A reader that still knows the old pack gets a not-found on
its range read, refreshes its index and reads the survivor pack. ``older_than`` is
checked against a fresh listing, and a key put again meanwhile is in a newer pack
that gc did not list, so it survives.

Every batch of four or more small objects makes a pack, so a store written in many small
batches gathers many packs; `FsspecBackend.repack` (``medomni cas repack``) merges the
small ones, in the same safe order.

Write times come from the writer's clock for packed objects (in the index; kept by
rewrites) and from the server (``LastModified``) for loose ones.

Refs (the atomic step). Update number ``seq + 1`` of a ref at ``seq`` is decided by
creating ``logs/<name>/<seq+1>`` create-only (``If-None-Match: *``): exactly one writer
succeeds, and from then on the update is committed. The ref object then moves to
``(new, seq + 1)`` with ``If-Match`` on the ETag it was read with. Any writer that finds
entry ``seq + 1`` present while the ref is still at ``seq`` rolls the ref forward to that
entry's value first, so a writer killed between the two writes loses nothing and blocks
no one. Readers of the ref alone may see the value before such an unfinished update
until the next writer completes it. The log entry is read only when the ref differs from
the expected value or the create loses, so a successful update costs three requests
(read, create, move). Ref names are percent-encoded into one flat key (see
`encode_ref_name`), so ``a`` and ``a/b`` coexist even on filesystems with real folders.

Conditional writes are detected: s3fs has them (``pipe_file(mode="create")`` and
``pipe_file(IfMatch=etag)``, ETags in ``info``); another filesystem that offers the same
calls declares ``supports_conditional_writes = True`` on its class. Without them the
backend sets ``supports_atomic_refs = False`` and the store refuses ref updates unless it
was opened with ``single_writer=True`` (the explicit opt-in: you hold the only writer);
the same steps then run with plain writes.

URLs: a scheme fsspec knows and medomni does not (``s3``, ``gs``, ``az``…) is passed to
fsspec as is. ``fsspec+<proto>://rest`` reaches fsspec's ``<proto>`` for schemes that
medomni claims for itself (``fsspec+memory://`` is fsspec's in-memory filesystem,
``fsspec+file://`` its local one). Query options: ``endpoint_url`` (s3; also taken from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), ``anon`` and ``conditional_writes``
(``0`` to force single-writer refs on an S3-compatible server without them).

Objects rely on whole-file writes being atomic, as on object stores. For a local folder
use ``file://`` (the directory backend), which writes through temp files.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import fsspec
from fsspec.asyn import sync

from medomni_cas.store.backend import FRESHEN_AFTER, Backend
from medomni_cas.store.backends._packs import (
    CorruptPack,
    PackIndex,
    build_index,
    build_pack,
    parse_index,
)
from medomni_cas.store.backends.directory import (
    decode_ref_name,
    encode_ref_name,
    key_of,
    split_key,
)

__all__ = ["CorruptPack", "FsspecBackend"]

#: Objects of at least this many bytes are stored loose, one file each (blob chunks).
LOOSE_SIZE = 256 * 1024
#: A batch with fewer small objects than this writes them loose (one request each) rather
#: than as a pack: two requests, and one more index for every reader to fetch.
PACK_MIN = 4
#: A pack holds at most this many bytes; a larger batch writes several.
PACK_BYTES = 64 << 20
#: Range reads from one pack are merged across gaps of up to this many bytes…
RANGE_GAP = 256 * 1024
#: …into requests of at most this many bytes.
RANGE_MAX = 32 << 20
#: Requests in flight at once on an async filesystem (and s3's connection pool size).
CONCURRENCY = 32
# Up to this many loose keys, presence is checked per key; above, by listing fan-out folders
# (on s3: one page of the listing first, which is all of it in a packed store).
PER_KEY_LIMIT = 32
# Above this many fan-out folders, one listing of all objects is cheaper than one per folder.
FOLDER_LIMIT = 32
# Each round of a ref update means another writer made progress; give up after this many.
MAX_ROUNDS = 1000
_FRESHEN_MS = int(FRESHEN_AFTER * 1000)
_TOMBSTONE = b"-"
_QUERY_OPTIONS = {"endpoint_url", "anon", "conditional_writes"}
# (pack name, offset, length, write time in ms) of a packed key
_Loc = tuple[str, int, int, int]


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in _protocols(fs) and hasattr(fs, "_call_s3")


def _flag(text: str, what: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"{what} must be 0 or 1, got {text!r}")


def _condition_failed(exc: BaseException) -> bool:
    """Whether a write failed on its precondition (412, 409 conflict), not for real."""
    if isinstance(exc, FileExistsError | FileNotFoundError):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.EINVAL, errno.EBUSY)


def _mtime(info: Mapping[str, Any]) -> float:
    """Write time of a listing entry; unknown counts as now so that gc never sweeps it."""
    for field in ("LastModified", "mtime", "modified", "created", "updated"):
        value = info.get(field)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return time.time()


def _dump_ref(value: bytes | None, seq: int) -> bytes:
    head = _TOMBSTONE if value is None else value.hex().encode()
    return head + b"\n%d\n" % seq


def _parse_value(line: bytes, where: str) -> bytes | None:
    if line == _TOMBSTONE:
        return None
    try:
        return bytes.fromhex(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{where}: expected a hex id or '-', got {line[:80]!r}") from None


class FsspecBackend(Backend):
    """Objects (packed and loose) and refs on an fsspec filesystem (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        conditional_writes: bool | None = None,
    ) -> None:
        self.url = url
        protocol, rest, options, query_conditional = _parse_url(url)
        options.update(storage_options or {})
        if protocol in ("s3", "s3a"):
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                options.setdefault("endpoint_url", endpoint)
            # several processes share refs: a cached listing or ETag would be stale
            options.setdefault("use_listings_cache", False)
            options.setdefault("config_kwargs", {"max_pool_connections": CONCURRENCY})
        self.fs, root = fsspec.url_to_fs(f"{protocol}://{rest}", **options)
        self.root = root.rstrip("/")
        if conditional_writes is None:
            conditional_writes = query_conditional
        if conditional_writes is None:
            declared = getattr(type(self.fs), "supports_conditional_writes", None)
            conditional_writes = _is_s3(self.fs) if declared is None else bool(declared)
        self.conditional_writes = conditional_writes
        self.supports_atomic_refs = conditional_writes
        self._s3 = _is_s3(self.fs)
        self._async = bool(getattr(self.fs, "async_impl", False))
        # s3fs sends a HEAD before each GET to size it for parallel ranges unless told
        # to read in one stream; loose objects are small enough for one stream
        self._cat_kw: dict[str, Any] = {"max_concurrency": 1} if self._s3 else {}
        # the merged pack index; `_where` is replaced whole or updated under `_lock`
        self._lock = threading.Lock()
        self._packs: dict[str, PackIndex] = {}
        self._pack_keys: dict[str, frozenset[bytes]] = {}
        self._pack_known_at: dict[str, float] = {}
        self._where: dict[bytes, _Loc] = {}
        self._refreshed_at: float | None = None  # monotonic time of the last listing
        self._loose_known: set[bytes] = set()

    @classmethod
    def from_url(cls, url: str) -> FsspecBackend:
        return cls(url)

    # -- paths ---------------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts)) if self.root else "/".join(parts)

    def _object_path(self, key: bytes) -> str:
        return self._path("objects", *split_key(key))

    def _pack_path(self, name: str, ext: str) -> str:
        return self._path("packs", f"{name}.{ext}")

    def _key_of_path(self, path: str) -> bytes | None:
        rel = path.rstrip("/").rsplit("/", 2)
        return key_of(rel[-2], rel[-1]) if len(rel) == 3 else None

    # -- batched I/O: concurrent on async filesystems ------------------------------------------
    def _gather(self, coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run coroutines on the filesystem's loop, `CONCURRENCY` at a time; exceptions are
        returned in place."""

        async def run() -> list[Any]:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(c: Coroutine[Any, Any, Any]) -> Any:
                async with gate:
                    return await c

            return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)

        return sync(self.fs.loop, run)

    def _cat_ranges(self, reqs: list[tuple[str, int, int]]) -> list[Any]:
        """Bytes ``[start, end)`` of each ``(path, start, end)``, or the exception raised."""
        if self._async:
            return self._gather([self.fs._cat_file(p, start=s, end=e) for p, s, e in reqs])
        out: list[Any] = []
        for p, s, e in reqs:
            try:
                out.append(self.fs.cat_file(p, start=s, end=e))
            except Exception as exc:
                out.append(exc)
        return out

    def _cat_whole(self, paths: list[str]) -> list[Any]:
        """The bytes of each file, or the exception raised (FileNotFoundError if absent)."""
        if self._async:
            return self._gather([self.fs._cat_file(p, **self._cat_kw) for p in paths])
        out: list[Any] = []
        for p in paths:
            try:
                out.append(self.fs.cat_file(p))
            except Exception as exc:
                out.append(exc)
        return out

    def _pipe_many(self, items: list[tuple[str, bytes]], *, create: bool = False) -> list[bool]:
        """Write each ``(path, bytes)``; with ``create``, only where absent (False: it was
        there). Any other failure raises, naming the file."""
        if not items:
            return []
        mode = "create" if create else "overwrite"
        if self._async:
            results = self._gather([self.fs._pipe_file(p, d, mode=mode) for p, d in items])
        else:
            results = []
            for p, d in items:
                try:
                    if create and self.fs.exists(p):
                        raise FileExistsError(p)
                    results.append(self.fs.pipe_file(p, d))
                except Exception as exc:
                    results.append(exc)
        out = []
        for (path, _), res in zip(items, results, strict=True):
            if isinstance(res, BaseException):
                if create and _condition_failed(res):
                    out.append(False)
                    continue
                raise OSError(f"{self.url}: writing {path} failed: {res}") from res
            out.append(True)
        return out

    def _list(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file below ``path`` (recursively): full path -> info with a write time."""
        if self._s3:
            return sync(self.fs.loop, self._s3_list, path)
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        return dict(sorted(found.items()))

    async def _s3_list(self, path: str, pages: int | None = None) -> dict[str, dict[str, Any]]:
        # one ListObjectsV2 per 1,000 keys; s3fs's find adds a HEAD when nothing is listed
        return (await self._s3_list_pages(path, pages))[0]

    async def _s3_list_pages(
        self, path: str, pages: int | None = None
    ) -> tuple[dict[str, dict[str, Any]], bool]:
        """The files below ``path`` from at most ``pages`` pages; and whether there are more."""
        bucket, key, _ = self.fs.split_path(path)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/" if key else ""}
        out: dict[str, dict[str, Any]] = {}
        while True:
            page = await self.fs._call_s3("list_objects_v2", **kwargs)
            for c in page.get("Contents", ()):
                out[f"{bucket}/{c['Key']}"] = {"size": c["Size"], "LastModified": c["LastModified"]}
            if not page.get("IsTruncated"):
                return out, False
            if pages is not None:
                pages -= 1
                if pages <= 0:
                    return out, True
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def _rm(self, paths: list[str]) -> None:
        if not paths:
            return
        try:
            self.fs.rm(paths)
        except FileNotFoundError:
            for p in paths:  # some were gone already (another gc): remove the rest
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(p)

    # -- the merged pack index -------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-list ``packs/``: fetch indexes written since the last listing, drop deleted ones."""
        started = time.monotonic()
        listing = self._list(self._path("packs"))
        listed = set()
        for path in listing:
            stem, dot, ext = path.rsplit("/", 1)[-1].partition(".")
            if dot and ext == "idx":
                listed.add(stem)
        new = sorted(n for n in listed if n not in self._packs)
        paths = [self._pack_path(n, "idx") for n in new]
        parsed: list[PackIndex] = []
        for name, path, data in zip(new, paths, self._cat_whole(paths), strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing (gc rewrote the pack)
            if isinstance(data, BaseException):
                raise OSError(f"{self.url}: reading pack index {path} failed: {data}") from data
            idx = parse_index(data, path)
            if idx.name != name:
                raise CorruptPack(path, f"this index describes pack {idx.name}, not {name}")
            parsed.append(idx)
        with self._lock:
            for idx in parsed:
                self._packs.setdefault(idx.name, idx)
                self._pack_known_at.setdefault(idx.name, started)
            # a pack written by this process after the listing started is not gone
            gone = [n for n in self._packs if n not in listed and self._pack_known_at[n] < started]
            for n in gone:
                self._forget_pack(n)
            if gone:
                self._rebuild()
            else:
                for idx in parsed:
                    self._merge(idx)
            self._refreshed_at = started

    def _ensure_index(self) -> None:
        if self._refreshed_at is None:
            self.refresh()

    def _merge(self, idx: PackIndex, where: dict[bytes, _Loc] | None = None) -> None:
        """Add a pack's entries; of several copies of a key, the newest write time wins."""
        if where is None:
            where = self._where
        name = idx.name
        for key, off, length, stamp in zip(
            idx.keys, idx.offsets, idx.lengths, idx.stamps, strict=True
        ):
            old = where.get(key)
            if old is None or stamp > old[3]:
                where[key] = (name, off, length, stamp)

    def _rebuild(self) -> None:
        # built aside and swapped in: readers do not take the lock
        where: dict[bytes, _Loc] = {}
        for idx in self._packs.values():
            self._merge(idx, where)
        self._where = where

    def _forget_pack(self, name: str) -> None:
        self._packs.pop(name, None)
        self._pack_keys.pop(name, None)
        self._pack_known_at.pop(name, None)

    def _add_pack(self, idx: PackIndex) -> None:
        with self._lock:
            self._packs[idx.name] = idx
            self._pack_known_at[idx.name] = time.monotonic()
            self._merge(idx)

    def _keys_of(self, name: str) -> frozenset[bytes]:
        keys = self._pack_keys.get(name)
        if keys is None:
            keys = self._pack_keys[name] = frozenset(self._packs[name].keys)
        return keys

    # -- objects: reading ------------------------------------------------------------------------
    def _read_packed(self, keys: Iterable[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """Bytes of packed keys, by merged range reads; and the keys whose pack is gone."""
        by_pack: dict[str, list[tuple[int, int, bytes]]] = {}
        where = self._where
        for key in keys:
            loc = where.get(key)
            if loc is not None:
                by_pack.setdefault(loc[0], []).append((loc[1], loc[2], key))
        reqs: list[tuple[str, int, int, list[tuple[int, int, bytes]]]] = []
        out: dict[bytes, bytes] = {}
        for name, entries in by_pack.items():
            entries.sort()
            path = self._pack_path(name, "pack")
            group: list[tuple[int, int, bytes]] = []
            start = end = 0
            for off, length, key in entries:
                if group and off - end <= RANGE_GAP and max(end, off + length) - start <= RANGE_MAX:
                    end = max(end, off + length)
                    group.append((off, length, key))
                    continue
                if group:
                    reqs.append((path, start, end, group))
                group, start, end = [(off, length, key)], off, off + length
            if group:
                reqs.append((path, start, end, group))
        todo = []
        for req in reqs:
            if req[2] == req[1]:  # only empty values: nothing to fetch
                out.update((key, b"") for _, _, key in req[3])
            else:
                todo.append(req)
        gone: list[bytes] = []
        results = self._cat_ranges([(p, s, e) for p, s, e, _ in todo])
        for (path, start, end, group), data in zip(todo, results, strict=True):
            if isinstance(data, FileNotFoundError):
                gone.extend(key for _, _, key in group)
                continue
            if isinstance(data, OSError) and data.errno == errno.EINVAL:
                # s3: 416, the range starts past the end of the file
                raise CorruptPack(path, f"pack is truncated: bytes {start}-{end} asked ({data})")
            if isinstance(data, BaseException):
                raise OSError(f"{self.url}: reading {path} failed: {data}") from data
            if len(data) != end - start:
                raise CorruptPack(
                    path,
                    f"pack is truncated: bytes {start}-{end} asked for, {len(data)} read",
                )
            for off, length, key in group:
                out[key] = data[off - start : off - start + length]
        return out, gone

    def _read_loose(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        out: dict[bytes, bytes] = {}
        for key, data in zip(
            keys, self._cat_whole([self._object_path(k) for k in keys]), strict=True
        ):
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise OSError(f"{self.url}: reading object {key.hex()} failed: {data}") from data
            out[key] = data
            self._loose_known.add(key)
        return out

    # docstring inherited
    def get(self, key: bytes) -> bytes:
        data = next(self.get_many([key]))[1]
        if data is None:
            raise KeyError(key)
        return data

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        keys = list(keys)
        if not keys:
            return iter(())
        asked = time.monotonic()
        self._ensure_index()
        unique = list(dict.fromkeys(keys))
        found, gone = self._read_packed(unique)
        found.update(self._read_loose([k for k in unique if k not in found and k not in gone]))
        if gone or (len(found) < len(unique) and (self._refreshed_at or 0) < asked):
            # packed by another writer since our listing, or moved by gc: look again
            self.refresh()
            again, gone = self._read_packed(k for k in unique if k not in found)
            if gone:
                loc = self._where.get(gone[0])
                path = self._pack_path(loc[0] if loc else "?", "pack")
                raise CorruptPack(path, "the pack is listed by its index but cannot be read")
            found.update(again)
        return iter([(k, found.get(k)) for k in keys])

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        keys = list(keys)
        if not keys:
            return []
        asked = time.monotonic()
        self._ensure_index()
        loose = self._loose_known
        absent = [k for k in dict.fromkeys(keys) if k not in self._where and k not in loose]
        if absent and (self._refreshed_at or 0) < asked:
            self.refresh()
            absent = [k for k in absent if k not in self._where]
        if absent:
            self._loose_known.update(self._loose_stamps(absent))
        where, loose = self._where, self._loose_known
        return [k for k in keys if k not in where and k not in loose]

    def contains(self, key: bytes) -> bool:
        return not self.missing([key])

    def _loose_stamps(self, keys: list[bytes]) -> dict[bytes, float]:
        """Write times of those ``keys`` that are stored loose."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        wanted = set(keys)
        if self._s3 and len(keys) > 1:
            # one page tells all when the store holds under 1,000 loose objects (a packed
            # store); else a HEAD per key, up to a listing's worth of them
            first, more = sync(self.fs.loop, self._s3_list_pages, self._path("objects"), 1)
            if not more:
                return self._stamps_in(first, wanted)
            if len(keys) <= 1000:
                return self._stamps_per_key(keys)
        elif len(keys) <= PER_KEY_LIMIT:
            return self._stamps_per_key(keys)
        folders = sorted({split_key(k)[0] for k in wanted})
        listings = (
            [self._path("objects")]
            if len(folders) > FOLDER_LIMIT
            else [self._path("objects", f) for f in folders]
        )
        out: dict[bytes, float] = {}
        for listing in listings:
            out.update(self._stamps_in(self._list(listing), wanted))
        return out

    def _stamps_in(
        self, listing: dict[str, dict[str, Any]], wanted: set[bytes]
    ) -> dict[bytes, float]:
        out: dict[bytes, float] = {}
        for path, info in listing.items():
            key = self._key_of_path(path)
            if key in wanted:
                out[key] = _mtime(info)
        return out

    def _stamps_per_key(self, keys: list[bytes]) -> dict[bytes, float]:
        paths = [self._object_path(k) for k in keys]
        if self._s3:
            times = sync(self.fs.loop, self._s3_head_all, paths)
        else:
            times = [self._info_mtime(p) for p in paths]
        return {k: t for k, t in zip(keys, times, strict=True) if t is not None}

    def _info_mtime(self, path: str) -> float | None:
        try:
            return _mtime(self.fs.info(path))
        except FileNotFoundError:
            return None

    async def _s3_head_all(self, paths: list[str]) -> list[float | None]:
        # s3fs's exists/info list the prefix after a 404 (is it a folder?): a HEAD suffices
        gate = asyncio.Semaphore(CONCURRENCY)

        async def head(path: str) -> float | None:
            bucket, key, _ = self.fs.split_path(path)
            try:
                async with gate:
                    resp = await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            return resp["LastModified"].timestamp()

        return list(await asyncio.gather(*(head(p) for p in paths)))

    def _listed_loose(self, hex_prefix: str = "") -> Iterator[tuple[bytes, dict[str, Any]]]:
        where = self._path("objects", hex_prefix[:2]) if len(hex_prefix) >= 2 else None
        found = self._list(where or self._path("objects"))
        for path in sorted(found):
            key = self._key_of_path(path)
            if key is not None and key.hex().startswith(hex_prefix):
                yield key, found[path]

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        self.refresh()
        with self._lock:
            keys = {k for k in self._where if k.hex().startswith(hex_prefix)}
        keys.update(k for k, _ in self._listed_loose(hex_prefix))
        return iter(sorted(keys))

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        self.refresh()
        with self._lock:
            stamps = {k: loc[3] / 1000.0 for k, loc in self._where.items()}
        for key, info in self._listed_loose():
            stamps[key] = max(stamps.get(key, 0.0), _mtime(info))
        return iter(list(stamps.items()))

    # -- objects: writing ------------------------------------------------------------------------
    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Store each absent ``(key, data)``: a pack for many small ones, loose otherwise.

        Presence is judged from the pack index this backend holds and the loose objects it
        has seen, with no request: a small object that exists only loose and unseen, or
        in a pack written since the last listing, is stored again (harmless: reads take
        either copy) and counted as new. A key present with a write time older than
        `FRESHEN_AFTER` is written again, so that gc's grace period counts from now.
        """
        batch: dict[bytes, bytes] = {}
        for key, data in items:
            batch.setdefault(bytes(key), data)
        if not batch:
            return 0
        self._ensure_index()
        now_ms = time.time_ns() // 1_000_000
        where = self._where
        present = {k for k in batch if k in where}
        small: list[tuple[bytes, bytes]] = []
        large: list[tuple[bytes, bytes]] = []
        for key, data in batch.items():
            loc = where.get(key)
            if loc is not None:
                if now_ms - loc[3] > _FRESHEN_MS:
                    small.append((key, data))  # packed, so small: pack it again, fresh
            elif len(data) >= LOOSE_SIZE or key in self._loose_known:
                large.append((key, data))  # the loose path checks presence and freshness
            else:
                small.append((key, data))
        if len(small) < PACK_MIN:
            large.extend(small)
            small = []
        absent = self._put_loose(large)
        self._put_packs(small, now_ms)
        return len(absent - present) + sum(1 for k, _ in small if k not in present)

    def _put_loose(self, items: list[tuple[bytes, bytes]]) -> set[bytes]:
        """Write loose objects that are absent (or stale); return the keys that were absent."""
        if not items:
            return set()
        now = time.time()
        paths = [(self._object_path(k), bytes(d)) for k, d in items]
        if self.conditional_writes:
            written = self._pipe_many(paths, create=True)
            existed = [k for (k, _), ok in zip(items, written, strict=True) if not ok]
            stamps = self._loose_stamps(existed) if existed else {}
            # rewrite the stale, and any whose "precondition failed" (s3fs may report other
            # errors the same way) left nothing there: a plain write of the same bytes
            redo = {k for k in existed if k not in stamps or now - stamps[k] > FRESHEN_AFTER}
            self._pipe_many([p for (k, _), p in zip(items, paths, strict=True) if k in redo])
            absent = {k for (k, _), ok in zip(items, written, strict=True) if ok}
            absent.update(k for k in existed if k not in stamps)
        else:
            stamps = self._loose_stamps([k for k, _ in items])
            todo = [
                p
                for (k, _), p in zip(items, paths, strict=True)
                if k not in stamps or now - stamps[k] > FRESHEN_AFTER
            ]
            self._pipe_many(todo)
            absent = {k for k, _ in items if k not in stamps}
        self._loose_known.update(k for k, _ in items)
        return absent

    def _put_packs(self, items: list[tuple[bytes, bytes]], now_ms: int) -> None:
        """Write ``items`` as packs of at most `PACK_BYTES`: all packs, then all indexes."""
        groups: list[list[tuple[bytes, bytes]]] = [[]]
        size = 0
        for item in items:
            if groups[-1] and size + len(item[1]) > PACK_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += len(item[1])
        built: list[tuple[PackIndex, bytes, bytes]] = []
        for group in groups:
            if not group:
                continue
            pack, offsets = build_pack([d for _, d in group])
            entries = [(k, off, len(d), now_ms) for (k, d), off in zip(group, offsets, strict=True)]
            name, idx_bytes = build_index(pack, entries)
            built.append((parse_index(idx_bytes, name), pack, idx_bytes))
        if not built:
            return
        # the pack first: an index's presence means its pack is complete
        self._pipe_many([(self._pack_path(i.name, "pack"), pack) for i, pack, _ in built])
        self._pipe_many([(self._pack_path(i.name, "idx"), idx) for i, _, idx in built])
        for idx, _, _ in built:
            self._add_pack(idx)

    # -- objects: deleting (gc) ------------------------------------------------------------------
    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        if not keys:
            return 0
        self.refresh()  # a fresh view: a key put again since gc listed it must be seen
        limit_ms = None if older_than is None else older_than * 1000.0
        where = self._where
        # where holds the newest copy's time: one fresh copy keeps every copy
        packed = {k for k in keys if k in where}
        doomed = {k for k in packed if limit_ms is None or where[k][3] < limit_ms}
        loose = self._loose_stamps([k for k in keys if k not in packed or k in doomed])
        loose_doomed = {k for k, t in loose.items() if older_than is None or t < older_than}
        doomed -= set(loose) - loose_doomed  # a fresh loose copy keeps the packed ones
        loose_doomed -= packed - doomed  # and a fresh packed copy keeps the loose one
        if doomed:
            self._rewrite_packs(doomed)
        if loose_doomed:
            self._rm([self._object_path(k) for k in loose_doomed])
            self._loose_known.difference_update(loose_doomed)
        return len(doomed | loose_doomed)

    def _rewrite_packs(self, doomed: set[bytes]) -> None:
        """Remove ``doomed`` keys from every pack holding one: survivors first go into a
        new pack (with their write times), then the old index and pack are deleted."""
        affected = [
            name for name in list(self._packs) if not self._keys_of(name).isdisjoint(doomed)
        ]
        for name in affected:
            idx = self._packs[name]
            keep = [
                (k, off, length, stamp)
                for k, off, length, stamp in zip(
                    idx.keys, idx.offsets, idx.lengths, idx.stamps, strict=True
                )
                if k not in doomed
            ]
            if keep:
                path = self._pack_path(name, "pack")
                data = self._cat_ranges([(path, 0, idx.pack_size)])[0]
                if isinstance(data, FileNotFoundError):
                    with self._lock:  # another gc rewrote it first
                        self._forget_pack(name)
                        self._rebuild()
                    continue
                if isinstance(data, BaseException):
                    raise OSError(f"{self.url}: reading {path} failed: {data}") from data
                if len(data) != idx.pack_size:
                    raise CorruptPack(
                        path, f"pack is truncated: {len(data)} of {idx.pack_size} bytes"
                    )
                pack, offsets = build_pack([data[off : off + n] for _, off, n, _ in keep])
                entries = [
                    (k, new_off, n, stamp)
                    for (k, _, n, stamp), new_off in zip(keep, offsets, strict=True)
                ]
                new_name, idx_bytes = build_index(pack, entries)
                if new_name == name:  # nothing of it was doomed after all
                    continue
                self._pipe_many([(self._pack_path(new_name, "pack"), pack)])
                self._pipe_many([(self._pack_path(new_name, "idx"), idx_bytes)])
                self._add_pack(parse_index(idx_bytes, new_name))
            # the index first: without it the pack is invisible, then an orphan to remove
            self._rm([self._pack_path(name, "idx")])
            self._rm([self._pack_path(name, "pack")])
            with self._lock:
                self._forget_pack(name)
                self._rebuild()

    def repack(self, *, small: int = PACK_BYTES // 4) -> int:
        """Merge every pack under ``small`` bytes into packs of up to `PACK_BYTES` (a store
        written in many small batches has many packs, and a cold reader fetches each
        index); return how many packs were merged away. Safe alongside readers, writers
        and gc, as gc's rewrites are: new packs first, then the old indexes and packs."""
        self.refresh()
        victims = sorted(
            (idx for idx in self._packs.values() if idx.pack_size < small),
            key=lambda idx: idx.name,
        )
        merged = 0
        group: list[PackIndex] = []
        size = 0
        for idx in [*victims, None]:
            if idx is not None and (not group or size + idx.pack_size <= PACK_BYTES):
                group.append(idx)
                size += idx.pack_size
                continue
            if len(group) > 1:
                merged += self._merge_packs(group)
            group, size = ([idx], idx.pack_size) if idx is not None else ([], 0)
        return merged

    def _merge_packs(self, group: list[PackIndex]) -> int:
        paths = [self._pack_path(idx.name, "pack") for idx in group]
        datas = self._cat_ranges(
            [(p, 0, idx.pack_size) for p, idx in zip(paths, group, strict=True)]
        )
        newest: dict[bytes, tuple[bytes, int]] = {}
        done: list[PackIndex] = []
        for idx, path, data in zip(group, paths, datas, strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # gone meanwhile (gc or another repack rewrote it)
            if isinstance(data, BaseException):
                raise OSError(f"{self.url}: reading {path} failed: {data}") from data
            if len(data) != idx.pack_size:
                raise CorruptPack(path, f"pack is truncated: {len(data)} of {idx.pack_size} bytes")
            done.append(idx)
            for k, off, n, stamp in zip(
                idx.keys, idx.offsets, idx.lengths, idx.stamps, strict=True
            ):
                if k not in newest or stamp > newest[k][1]:
                    newest[k] = (data[off : off + n], stamp)
        if len(done) < 2:
            return 0
        items = list(newest.items())
        pack, offsets = build_pack([d for _, (d, _) in items])
        entries = [
            (k, off, len(d), stamp) for (k, (d, stamp)), off in zip(items, offsets, strict=True)
        ]
        name, idx_bytes = build_index(pack, entries)
        self._pipe_many([(self._pack_path(name, "pack"), pack)])
        self._pipe_many([(self._pack_path(name, "idx"), idx_bytes)])
        self._add_pack(parse_index(idx_bytes, name))
        self._rm([self._pack_path(idx.name, "idx") for idx in done])
        self._rm([self._pack_path(idx.name, "pack") for idx in done])
        with self._lock:
            for idx in done:
                self._forget_pack(idx.name)
            self._rebuild()
        return len(done)

    def remove_orphans(self, older_than: float) -> int:
        """Pack files without an index (a writer or gc died between the two), older than
        ``older_than``."""
        listing = self._list(self._path("packs"))
        stems = {p.rsplit("/", 1)[-1].partition(".")[0] for p in listing if p.endswith(".idx")}
        orphans = [
            p
            for p, info in listing.items()
            if p.endswith(".pack")
            and p.rsplit("/", 1)[-1].partition(".")[0] not in stems
            and _mtime(info) < older_than
        ]
        self._rm(orphans)
        return len(orphans)

    # -- refs: reading -------------------------------------------------------------------------
    def _ref_path(self, encoded: str) -> str:
        return self._path("refs", encoded)

    def _log_path(self, encoded: str, seq: int) -> str:
        return self._path("logs", encoded, f"{seq:020d}")

    def _read_ref(self, encoded: str) -> tuple[bytes | None, int, str | None]:
        """The ref's value, update count and ETag (None when conditional writes are off)."""
        path = self._ref_path(encoded)
        data, etag = self._read_versioned(path)
        if data is None:
            return None, 0, None
        lines = data.split(b"\n")
        try:
            seq = int(lines[1]) if len(lines) > 1 and lines[1] else 0
        except ValueError:
            raise ValueError(f"{path}: not a ref object (bad update count)") from None
        return _parse_value(lines[0], path), seq, etag

    def _read_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        """Bytes and the ETag of exactly those bytes (a later ETag could be a newer write)."""
        if not self.conditional_writes:
            try:
                return self.fs.cat_file(path, **self._cat_kw), None
            except FileNotFoundError:
                return None, None
        if self._s3:
            return sync(self.fs.loop, self._s3_get_versioned, path)
        for _ in range(MAX_ROUNDS):
            try:
                etag = self.fs.info(path)["ETag"]
                data = self.fs.cat_file(path)
                if self.fs.info(path)["ETag"] == etag:
                    return data, etag
            except FileNotFoundError:
                return None, None
        raise OSError(f"{path}: changes too fast to read a consistent version")

    async def _s3_get_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        bucket, key, _ = self.fs.split_path(path)
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None, None
        try:
            return await resp["Body"].read(), resp["ETag"]
        finally:
            resp["Body"].close()

    def _read_entry(self, encoded: str, seq: int) -> bytes | None:
        try:
            return self.fs.cat_file(self._log_path(encoded, seq), **self._cat_kw)
        except FileNotFoundError:
            return None

    def _name_of(self, encoded: str) -> str | None:
        name = decode_ref_name(encoded)
        if name is None:
            try:
                name = self.fs.cat_file(self._path("names", encoded), **self._cat_kw).decode()
            except FileNotFoundError:
                return None
        return name

    def ref_get(self, name: str) -> bytes | None:
        return self._read_ref(encode_ref_name(name))[0]

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        """Each ref's value; on s3 the reads run concurrently."""
        if not (self._s3 and self.conditional_writes):
            return [self.ref_get(name) for name in names]
        paths = [self._ref_path(encode_ref_name(name)) for name in names]
        got = self._gather([self._s3_get_versioned(p) for p in paths])
        out: list[bytes | None] = []
        for name, path, res in zip(names, paths, got, strict=True):
            if isinstance(res, BaseException):
                raise OSError(f"{self.url}: reading ref {name!r} failed: {res}") from res
            data = res[0]
            out.append(None if data is None else _parse_value(data.split(b"\n", 1)[0], path))
        return out

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        named = []
        for path in self._list(self._path("refs")):
            encoded = path.rsplit("/", 1)[-1]
            name = self._name_of(encoded)
            if name is not None and name.startswith(prefix):
                named.append((name, path))
        named.sort()
        if not named:
            return
        got = self._cat_whole([p for _, p in named])
        for (name, path), data in zip(named, got, strict=True):
            if isinstance(data, bytes):
                value = _parse_value(data.split(b"\n", 1)[0], path)
                if value is not None:
                    yield name, value
            elif not isinstance(data, FileNotFoundError):
                raise OSError(f"{self.url}: reading ref {name!r} failed: {data}") from data

    def ref_log(self, name: str) -> list[bytes]:
        paths = sorted(self._list(self._path("logs", encode_ref_name(name))))
        if not paths:
            return []
        out = []
        for data in self._cat_whole(paths):
            if isinstance(data, bytes):
                out.append(data.split(b"\n", 1)[1] if b"\n" in data else b"")
            elif not isinstance(data, FileNotFoundError):
                raise OSError(f"{self.url}: reading history of {name!r} failed: {data}") from data
        return out

    def ref_log_names(self) -> Iterator[str]:
        logs = self._path("logs")
        self.fs.invalidate_cache(logs)
        try:
            listed = self.fs.ls(logs, detail=False)
        except FileNotFoundError:
            return
        names = (self._name_of(p.rstrip("/").rsplit("/", 1)[-1]) for p in listed)
        yield from sorted(n for n in names if n is not None)

    # -- refs: the atomic update ---------------------------------------------------------------
    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: bytes) -> bool:
        encoded = encode_ref_name(name)
        if encoded.startswith("~"):
            self.fs.pipe_file(self._path("names", encoded), name.encode())
        record = (_TOMBSTONE if new is None else bytes(new).hex().encode()) + b"\n" + entry
        for _ in range(MAX_ROUNDS):
            value, seq, etag = self._read_ref(encoded)
            if value == old and self._create(self._log_path(encoded, seq + 1), record):
                self._move_ref(name, encoded, etag, None if new is None else bytes(new), seq + 1)
                return True
            # the ref differs, or update seq + 1 was decided by another writer: an update
            # decided but not moved yet (its writer may be dead) is rolled forward first
            pending = self._read_entry(encoded, seq + 1)
            if pending is not None:
                target = _parse_value(pending.split(b"\n", 1)[0], self._log_path(encoded, seq + 1))
                self._move_ref(name, encoded, etag, target, seq + 1)
                continue
            if value != old:
                return False
        return False  # every round, another writer got there first

    def _move_ref(
        self, name: str, encoded: str, etag: str | None, value: bytes | None, seq: int
    ) -> None:
        """Move the ref from update ``seq - 1`` to ``seq`` (a no-op if someone else did)."""
        data = _dump_ref(value, seq)
        path = self._ref_path(encoded)
        for _ in range(MAX_ROUNDS):
            if self._replace(path, data, etag):
                return
            _, current, etag = self._read_ref(encoded)
            if current >= seq:
                return  # another writer rolled it forward
            if current != seq - 1:
                raise RuntimeError(
                    f"{path}: ref {name!r} is at update {current}, expected {seq - 1}; "
                    f"its history under {self._path('logs', encoded)} is inconsistent"
                )
        raise RuntimeError(f"{path}: ref {name!r} could not be moved to update {seq}")

    def _create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if absent; False when it exists."""
        if not self.conditional_writes:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except OSError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    def _replace(self, path: str, data: bytes, etag: str | None) -> bool:
        """Write ``path`` if its ETag is still ``etag`` (None: if it is absent)."""
        if not self.conditional_writes:
            self.fs.pipe_file(path, data)
            return True
        if etag is None:
            return self._create(path, data)
        try:
            self.fs.pipe_file(path, data, IfMatch=etag)
        except OSError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True


def _parse_url(url: str) -> tuple[str, str, dict[str, Any], bool | None]:
    """``(protocol, rest, storage options, conditional_writes)`` of a backend URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a store URL (expected scheme://…): {url!r}")
    protocol = scheme.removeprefix("fsspec+")
    if not protocol:
        raise ValueError(f"{url!r}: fsspec+ needs a protocol, e.g. fsspec+memory://bucket/x")
    rest, _, query = rest.partition("?")
    given = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(given) - _QUERY_OPTIONS
    if unknown:
        raise ValueError(
            f"{url!r}: unknown option(s) {sorted(unknown)}; known: {sorted(_QUERY_OPTIONS)}"
        )
    options: dict[str, Any] = {}
    if "endpoint_url" in given:
        options["endpoint_url"] = given["endpoint_url"]
    if "anon" in given:
        options["anon"] = _flag(given["anon"], f"{url!r}: anon")
    conditional = given.get("conditional_writes")
    return (
        protocol,
        rest,
        options,
        None if conditional is None else _flag(conditional, f"{url!r}: conditional_writes"),
    )
