"""Any fsspec filesystem as a backend: ``s3://bucket/prefix``, ``gs://…``, ``fsspec+<proto>://…``.

Layout under the root::

    objects/ab/cdef…        one object per key (pack files come later)
    refs/<name>             "<hex id or ->\\n<seq>\\n": the ref and the number of its updates
    logs/<name>/<seq:020d>  update number seq: "<new hex id or ->\\n" + the history entry
    names/~<hash>           the full name of a ref whose encoded name is too long

Ref names are percent-encoded into one flat key (see `encode_ref_name`), so ``a`` and
``a/b`` coexist even on filesystems with real folders.

URLs: a scheme fsspec knows and medomni does not (``s3``, ``gs``, ``az``…) is passed to
fsspec as is. ``fsspec+<proto>://rest`` reaches fsspec's ``<proto>`` for schemes that
medomni claims for itself (``fsspec+memory://`` is fsspec's in-memory filesystem,
``fsspec+file://`` its local one). Query options: ``endpoint_url`` (s3; also taken from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``), ``anon`` and ``conditional_writes``
(``0`` to force single-writer refs on an S3-compatible server without them).

Ref updates (the atomic step). Update number ``seq + 1`` of a ref at ``seq`` is decided by
creating ``logs/<name>/<seq+1>`` create-only: exactly one writer succeeds, and from then on
the update is committed. The ref object then moves to ``(new, seq + 1)`` with ``If-Match``
on the ETag it was read with. Any writer that finds entry ``seq + 1`` present while the ref
is still at ``seq`` rolls the ref forward to that entry's value first, so a writer killed
between the two writes loses nothing and blocks no one. Readers of the ref alone may see
the value before such an unfinished update until the next writer completes it.

Conditional writes are detected: s3fs has them (``pipe_file(mode="create")`` and
``pipe_file(IfMatch=etag)``, ETags in ``info``); another filesystem that offers the same
calls declares ``supports_conditional_writes = True`` on its class. Without them the
backend sets ``supports_atomic_refs = False`` and the store refuses ref updates unless it
was opened with ``single_writer=True``; the same steps then run with plain writes.

Objects rely on whole-object writes being atomic, as on object stores. For a local folder
use ``file://`` (the directory backend), which writes through temp files.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import fsspec
from fsspec.asyn import sync

from medomni_cas.store.backend import FRESHEN_AFTER, Backend
from medomni_cas.store.backends.directory import (
    decode_ref_name,
    encode_ref_name,
    key_of,
    split_key,
)

__all__ = ["FsspecBackend"]

# Up to this many ids, presence is checked per key; above, by listing fan-out folders.
PER_KEY_LIMIT = 32
# Above this many fan-out folders, one listing of all objects is cheaper than one per folder.
FOLDER_LIMIT = 32
# Each round of a ref update means another writer made progress; give up after this many.
MAX_ROUNDS = 1000
_TOMBSTONE = b"-"
_QUERY_OPTIONS = {"endpoint_url", "anon", "conditional_writes"}


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
    """Objects and refs on an fsspec filesystem (see the module docstring)."""

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
        # s3fs sends a HEAD before each GET to size it for parallel ranges unless told
        # to read in one stream; objects here are small enough for one stream
        self._cat_kw: dict[str, Any] = {"max_concurrency": 1} if self._s3 else {}

    @classmethod
    def from_url(cls, url: str) -> FsspecBackend:
        return cls(url)

    # -- paths ---------------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts)) if self.root else "/".join(parts)

    def _object_path(self, key: bytes) -> str:
        return self._path("objects", *split_key(key))

    def _key_of_path(self, path: str) -> bytes | None:
        rel = path.rstrip("/").rsplit("/", 2)
        return key_of(rel[-2], rel[-1]) if len(rel) == 3 else None

    def _find(self, path: str, *, detail: bool = False) -> Any:
        self.fs.invalidate_cache(path)
        try:
            return self.fs.find(path, detail=detail)
        except FileNotFoundError:
            return {} if detail else []

    # -- objects -------------------------------------------------------------------------------
    # docstring inherited
    def get(self, key: bytes) -> bytes:
        try:
            return self.fs.cat_file(self._object_path(key), **self._cat_kw)
        except FileNotFoundError:
            raise KeyError(key) from None

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        keys = list(keys)
        if not keys:
            return iter(())
        paths = [self._object_path(k) for k in keys]
        got = self.fs.cat(list(dict.fromkeys(paths)), on_error="return", **self._cat_kw)
        out: list[tuple[bytes, bytes | None]] = []
        for key, path in zip(keys, paths, strict=True):
            value = got.get(path)
            if isinstance(value, FileNotFoundError) or value is None:
                out.append((key, None))
            elif isinstance(value, BaseException):
                raise OSError(f"{self.url}: reading object {key.hex()} failed: {value}") from value
            else:
                out.append((key, value))
        return iter(out)

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        batch = dict(reversed(list(items)))  # first occurrence of a key wins
        if not batch:
            return 0
        stamps = self._stamps(list(batch))
        now = time.time()
        # an old object put again is rewritten: gc's grace period counts from its write time
        todo = {
            self._object_path(k): bytes(d)
            for k, d in batch.items()
            if k not in stamps or now - stamps[k] > FRESHEN_AFTER
        }
        if todo:
            self.fs.pipe(todo)
        return sum(1 for k in batch if k not in stamps)

    def contains(self, key: bytes) -> bool:
        return key in self._stamps([key])

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        keys = list(keys)
        present = self._stamps(keys)
        return [k for k in keys if k not in present]

    def _stamps(self, keys: list[bytes]) -> dict[bytes, float]:
        """Write times of those ``keys`` that are stored."""
        if len(set(keys)) <= PER_KEY_LIMIT:
            return self._stamps_per_key(list(dict.fromkeys(keys)))
        wanted = set(keys)
        folders = sorted({split_key(k)[0] for k in wanted})
        listings = (
            [self._path("objects")]
            if len(folders) > FOLDER_LIMIT
            else [self._path("objects", f) for f in folders]
        )
        out: dict[bytes, float] = {}
        for listing in listings:
            for path, info in self._find(listing, detail=True).items():
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
        async def head(path: str) -> float | None:
            bucket, key, _ = self.fs.split_path(path)
            try:
                resp = await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            return resp["LastModified"].timestamp()

        return list(await asyncio.gather(*(head(p) for p in paths)))

    def _listed(self, hex_prefix: str = "") -> Iterator[tuple[bytes, dict[str, Any]]]:
        where = self._path("objects", hex_prefix[:2]) if len(hex_prefix) >= 2 else None
        found = self._find(where or self._path("objects"), detail=True)
        for path in sorted(found):
            key = self._key_of_path(path)
            if key is not None and key.hex().startswith(hex_prefix):
                yield key, found[path]

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        for key, _ in self._listed(hex_prefix):
            yield key

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        for key, info in self._listed():
            yield key, _mtime(info)

    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        stamps = self._stamps(list(keys))
        present = [k for k, t in stamps.items() if older_than is None or t < older_than]
        if present:
            self.fs.rm([self._object_path(k) for k in present])
        return len(present)

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
                name = self.fs.cat_file(self._path("names", encoded)).decode()
            except FileNotFoundError:
                return None
        return name

    def ref_get(self, name: str) -> bytes | None:
        return self._read_ref(encode_ref_name(name))[0]

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        named = []
        for path in self._find(self._path("refs")):
            encoded = path.rsplit("/", 1)[-1]
            name = self._name_of(encoded)
            if name is not None and name.startswith(prefix):
                named.append((name, path))
        named.sort()
        if not named:
            return
        got = self.fs.cat([p for _, p in named], on_error="return", **self._cat_kw)
        for name, path in named:
            data = got.get(path)
            if isinstance(data, bytes):
                value = _parse_value(data.split(b"\n", 1)[0], path)
                if value is not None:
                    yield name, value
            elif data is not None and not isinstance(data, FileNotFoundError):
                raise OSError(f"{self.url}: reading ref {name!r} failed: {data}") from data

    def ref_log(self, name: str) -> list[bytes]:
        paths = sorted(self._find(self._path("logs", encode_ref_name(name))))
        if not paths:
            return []
        got = self.fs.cat(paths, on_error="return", **self._cat_kw)
        out = []
        for path in paths:
            data = got.get(path)
            if isinstance(data, bytes):
                out.append(data.split(b"\n", 1)[1] if b"\n" in data else b"")
            elif data is not None and not isinstance(data, FileNotFoundError):
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
            pending = self._read_entry(encoded, seq + 1)
            if pending is not None:
                # an update was decided but the ref not moved yet (its writer may be dead)
                target = _parse_value(pending.split(b"\n", 1)[0], self._log_path(encoded, seq + 1))
                self._move_ref(name, encoded, etag, target, seq + 1)
                continue
            if value != old:
                return False
            if not self._create(self._log_path(encoded, seq + 1), record):
                continue  # another writer decided update seq + 1 first
            self._move_ref(name, encoded, etag, None if new is None else bytes(new), seq + 1)
            return True
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
