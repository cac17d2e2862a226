"""Requests to the filesystem: the only code that knows sync versus async fsspec, and s3fs.

Batches run concurrently (`CONCURRENCY` in flight) on a filesystem with an async API, one
after another on the others; either way each item's exception is returned in its place,
so that the caller can tell "absent" from "failed" per file.

s3 quirks kept here:

* every whole-file read passes ``max_concurrency=1``: otherwise s3fs sends a HEAD before
  each GET to size it for parallel ranges;
* listings are raw ``ListObjectsV2`` pages, one request per 1,000 keys (s3fs's own
  ``find`` adds a HEAD when a prefix is empty), and presence is a raw HEAD (s3fs's
  ``exists``/``info`` list the prefix after a 404, in case it is a folder);
* a conditional write that loses reports 412 or 409 as ``FileExistsError``,
  ``FileNotFoundError`` or an `OSError` with ``EINVAL``/``EBUSY`` (`condition_failed`).

Conditional writes (create-only, replace-if-ETag) are what make ref updates atomic. s3fs
has them; another filesystem that offers the same calls (``pipe_file(mode="create")``,
``pipe_file(IfMatch=etag)``, ETags in ``info``) declares ``supports_conditional_writes =
True`` on its class. Without them the same calls run as plain writes.
"""

from __future__ import annotations

import asyncio
import builtins  # in Remote below `list` is its method: annotations say builtins.list
import contextlib
import errno
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any

import fsspec
from fsspec.asyn import sync

__all__ = [
    "CONCURRENCY",
    "PER_KEY_LIMIT",
    "Remote",
    "condition_failed",
    "has_conditional_writes",
    "mtime",
]

#: Requests in flight at once on an async filesystem (and s3's connection pool size).
CONCURRENCY = 32
#: Up to this many keys, presence is checked per key rather than by listing folders.
PER_KEY_LIMIT = 32
# One ListObjectsV2 page: up to this many keys, HEADs in flight beat paging a big listing.
_S3_PAGE = 1000
# A file that changes this many times while it is read cannot be read consistently.
_VERSION_ROUNDS = 1000


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in _protocols(fs) and hasattr(fs, "_call_s3")


def has_conditional_writes(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` can write create-only and replace-if-ETag (s3fs, or declared)."""
    declared = getattr(type(fs), "supports_conditional_writes", None)
    return _is_s3(fs) if declared is None else bool(declared)


def condition_failed(exc: BaseException) -> bool:
    """Whether a write failed on its precondition (412, 409 conflict), not for real."""
    if isinstance(exc, FileExistsError | FileNotFoundError):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.EINVAL, errno.EBUSY)


def mtime(info: Mapping[str, Any]) -> float:
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


class Remote:
    """The filesystem under one root, as batches of requests (see the module docstring)."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, *, url: str, conditional_writes: bool
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.conditional_writes = conditional_writes
        self.is_s3 = _is_s3(fs)
        self._async = bool(getattr(fs, "async_impl", False))
        # loose objects and ref files are small enough for one stream (no sizing HEAD)
        self._cat_kw: dict[str, Any] = {"max_concurrency": 1} if self.is_s3 else {}

    def path(self, *parts: str) -> str:
        """The full path of ``parts`` under the root."""
        return "/".join((self.root, *parts)) if self.root else "/".join(parts)

    def _run[**P, T](
        self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(*args, **kwargs)`` run to its end on the filesystem's loop."""
        result: T = sync(self.fs.loop, fn, *args, **kwargs)  # fsspec is untyped: fn's result
        return result

    # -- reading ---------------------------------------------------------------------------
    def gather(self, coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run coroutines on the filesystem's loop, `CONCURRENCY` at a time; exceptions are
        returned in place."""

        async def run() -> list[Any]:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(c: Coroutine[Any, Any, Any]) -> Any:
                async with gate:
                    return await c

            return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)

        return self._run(run)

    def cat(self, path: str) -> bytes | None:
        """The bytes of one file, or None when it is absent."""
        try:
            data: bytes = self.fs.cat_file(path, **self._cat_kw)
        except FileNotFoundError:
            return None
        return data

    def cat_whole(self, paths: list[str]) -> list[Any]:
        """The bytes of each file, or the exception raised (FileNotFoundError if absent)."""
        if self._async:
            return self.gather([self.fs._cat_file(p, **self._cat_kw) for p in paths])
        out: list[Any] = []
        for p in paths:
            try:
                out.append(self.fs.cat_file(p))
            except Exception as exc:
                out.append(exc)
        return out

    def cat_ranges(self, reqs: list[tuple[str, int, int]]) -> list[Any]:
        """Bytes ``[start, end)`` of each ``(path, start, end)``, or the exception raised."""
        if self._async:
            return self.gather([self.fs._cat_file(p, start=s, end=e) for p, s, e in reqs])
        out: list[Any] = []
        for p, s, e in reqs:
            try:
                out.append(self.fs.cat_file(p, start=s, end=e))
            except Exception as exc:
                out.append(exc)
        return out

    # -- listing ---------------------------------------------------------------------------
    def list(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file below ``path`` (recursively): full path -> info with a write time."""
        if self.is_s3:
            return self._run(self._s3_list_pages, path, None)[0]
        self.fs.invalidate_cache(path)
        try:
            found: dict[str, dict[str, Any]] = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        return dict(sorted(found.items()))

    def first_page(self, path: str) -> tuple[dict[str, dict[str, Any]], bool] | None:
        """The files of the first listing page below ``path`` and whether there are more;
        None where a listing has no cheap first page (not s3)."""
        if not self.is_s3:
            return None
        return self._run(self._s3_list_pages, path, 1)

    def names_starting(self, path: str, pages: int) -> set[str] | None:
        """The full paths of the files whose path starts with ``path`` (a name's start, not
        a folder), from at most ``pages`` listing pages; None when there are more, or where
        a listing has no cheap pages (not s3)."""
        if not self.is_s3:
            return None
        found, more = self._run(self._s3_list_pages, path, pages, False)
        return None if more else set(found)

    async def _s3_list_pages(
        self, path: str, pages: int | None, folder: bool = True
    ) -> tuple[dict[str, dict[str, Any]], bool]:
        """The files below ``path`` (or, not ``folder``, whose key starts with it) from at
        most ``pages`` pages; and whether there are more."""
        bucket, key, _ = self.fs.split_path(path)
        prefix = (key.rstrip("/") + "/" if key else "") if folder else key
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
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

    @property
    def per_key_limit(self) -> int:
        """Up to this many files, `mtimes` (a request per file) beats a listing."""
        return _S3_PAGE if self.is_s3 else PER_KEY_LIMIT

    def mtimes(self, paths: builtins.list[str]) -> builtins.list[float | None]:
        """The write time of each file, None where it is absent: a request per file."""
        if self.is_s3:
            return self._run(self._s3_head_all, paths)
        out: builtins.list[float | None] = []
        for path in paths:
            try:
                out.append(mtime(self.fs.info(path)))
            except FileNotFoundError:
                out.append(None)
        return out

    async def _s3_head_all(self, paths: builtins.list[str]) -> builtins.list[float | None]:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def head(path: str) -> float | None:
            bucket, key, _ = self.fs.split_path(path)
            try:
                async with gate:
                    resp = await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            stamp: float = resp["LastModified"].timestamp()  # a datetime (aiobotocore: untyped)
            return stamp

        return list(await asyncio.gather(*(head(p) for p in paths)))

    def child_names(self, path: str) -> builtins.list[str]:
        """The names of the entries directly below ``path`` (empty when there is none)."""
        self.fs.invalidate_cache(path)
        try:
            listed = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in listed]

    # -- writing ---------------------------------------------------------------------------
    def pipe(self, path: str, data: bytes) -> None:
        """Write one file whole (unconditionally)."""
        self.fs.pipe_file(path, data)

    def pipe_many(
        self, items: builtins.list[tuple[str, bytes]], *, create: bool = False
    ) -> builtins.list[bool]:
        """Write each ``(path, bytes)``; with ``create``, only where absent (False: it was
        there). Any other failure raises, naming the file."""
        if not items:
            return []
        mode = "create" if create else "overwrite"
        if self._async:
            results = self.gather([self.fs._pipe_file(p, d, mode=mode) for p, d in items])
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
                if create and condition_failed(res):
                    out.append(False)
                    continue
                raise OSError(f"{self.url}: writing {path} failed: {res}") from res
            out.append(True)
        return out

    def rm(self, paths: builtins.list[str]) -> None:
        """Remove the files that exist of ``paths``."""
        if not paths:
            return
        try:
            self.fs.rm(paths)
        except FileNotFoundError:
            for p in paths:  # some were gone already (another gc): remove the rest
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(p)

    # -- conditional writes ------------------------------------------------------------------
    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if absent; False when it exists."""
        if not self.conditional_writes:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except OSError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

    def replace(self, path: str, data: bytes, etag: str | None) -> bool:
        """Write ``path`` if its ETag is still ``etag`` (None: if it is absent)."""
        if not self.conditional_writes:
            self.fs.pipe_file(path, data)
            return True
        if etag is None:
            return self.create(path, data)
        try:
            self.fs.pipe_file(path, data, IfMatch=etag)
        except OSError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

    def read_versioned(self, path: str) -> tuple[bytes | None, str | None]:
        """Bytes and the ETag of exactly those bytes (a later ETag could be a newer write);
        the ETag is None when conditional writes are off, both are None when absent."""
        if not self.conditional_writes:
            return self.cat(path), None
        if self.is_s3:
            return self._run(self._s3_get_versioned, path)
        for _ in range(_VERSION_ROUNDS):
            try:
                etag = self.fs.info(path)["ETag"]
                data = self.fs.cat_file(path)
                if self.fs.info(path)["ETag"] == etag:
                    return data, etag
            except FileNotFoundError:
                return None, None
        raise OSError(f"{path}: changes too fast to read a consistent version")

    def read_versioned_many(self, paths: builtins.list[str]) -> builtins.list[Any]:
        """`read_versioned` of each path (concurrently on s3), or the exception raised."""
        if self.is_s3 and self.conditional_writes:
            return self.gather([self._s3_get_versioned(p) for p in paths])
        out: builtins.list[Any] = []
        for p in paths:
            try:
                out.append(self.read_versioned(p))
            except Exception as exc:
                out.append(exc)
        return out

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
