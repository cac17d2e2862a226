"""A remote store behind a local cache: ``medomni_cas.open("s3://bucket/prefix", cache=True)``.

`CachedBackend` *is* the remote store, made fast: the remote is the authority for refs and
for what exists; the local backend (LMDB by default) holds copies.

* Reads look in the cache first; what is not there is read from the remote (batched),
  verified against its id and only then put in the cache. A corrupt remote object
  raises `IntegrityError` naming it and the remote, and is not cached.
* Object writes go to the cache only (fast, no requests). They reach the remote when a
  ref is pointed at them: ``ref_update`` first publishes the closure of the new value
  (only what the remote lacks, children before parents), then makes the compare-and-swap
  on the remote. `CachedBackend.publish` pushes closures without a ref. Objects that no
  ref on the remote names stay local.
* Publishing walks objects, which is the store's business, not a backend's: the caller
  gives the function that does it (`Publish`; `medomni_cas.store.url.open_store` passes
  one built on `medomni_cas.store.sync.send`), so that this module imports no store.
* Refs are the remote's, read and written there: ``store.refs[...]`` is always current,
  and ref updates keep the remote's compare-and-swap and history.
* Presence (``contains``, ``missing``) is the cache's or else the remote's.

The cache is a cache: no gc runs on it (``supports_deletes`` is False; delete its folder
to free it; objects written and not yet published are lost with it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import blake3

from medomni_cas.errors import IntegrityError, UnsupportedOperation
from medomni_cas.store.backend import Backend, Entry

__all__ = ["CachedBackend", "Publish"]

#: ``publish(source, remote, roots) -> objects sent``: copy the closures of ``roots`` from
#: ``source`` (the cached backend) to ``remote``, only what ``remote`` lacks, children
#: before parents, so that a ref set on the remote never names an object it lacks.
Publish = Callable[[Backend, Backend, Iterable[bytes]], int]


class CachedBackend(Backend):
    """``remote`` seen through the object cache ``local`` (see the module docstring)."""

    supports_deletes = False

    def __init__(self, local: Backend, remote: Backend, *, publish: Publish) -> None:
        self.local = local
        self.remote = remote
        self._publish = publish
        self.url = remote.url
        self.supports_atomic_refs = remote.supports_atomic_refs

    def __repr__(self) -> str:
        return f"CachedBackend({self.remote.url!r}, cache={self.local.url!r})"

    # -- objects ---------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes:
        # docstring inherited
        data = next(self.get_many([key]))[1]
        if data is None:
            raise KeyError(key)
        return data

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        # docstring inherited
        keys = list(keys)
        got = dict(self.local.get_many(keys))
        absent = [k for k, v in got.items() if v is None]
        if absent:
            fetched: list[tuple[bytes, bytes]] = []
            for key, data in self.remote.get_many(absent):
                if data is None:
                    continue
                digest = blake3.blake3(data).digest()
                if digest != key:
                    raise IntegrityError(bytes(key).hex(), digest.hex(), self.remote.url)
                fetched.append((key, data))
                got[key] = data
            if fetched:
                self.local.put_many(fetched)
        return iter([(k, got[k]) for k in keys])

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        # docstring inherited
        return self.local.put_many(items)

    def contains(self, key: bytes) -> bool:
        # docstring inherited
        return self.local.contains(key) or self.remote.contains(key)

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        # docstring inherited
        absent = self.local.missing(keys)
        return self.remote.missing(absent) if absent else []

    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        # docstring inherited
        keys = set(self.local.iter_keys(hex_prefix))
        keys.update(self.remote.iter_keys(hex_prefix))
        return iter(sorted(keys))

    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        # docstring inherited
        stamps = dict(self.remote.iter_stamps())
        for key, stamp in self.local.iter_stamps():
            stamps[key] = max(stamp, stamps.get(key, 0.0))
        return iter(list(stamps.items()))

    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        # docstring inherited
        raise UnsupportedOperation(
            f"{self.url}: a cached store does not delete objects; run gc on the remote "
            f"itself, and delete the cache ({self.local.url}) to free it"
        )

    def publish(self, roots: Iterable[bytes]) -> int:
        """Push the closures of ``roots`` to the remote (only what it lacks); return how
        many objects were sent."""
        return self._publish(self, self.remote, roots)

    # -- refs: the remote's ----------------------------------------------------------------
    def ref_get(self, name: str) -> bytes | None:
        # docstring inherited
        return self.remote.ref_get(name)

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        # docstring inherited
        return self.remote.ref_get_many(names)

    def ref_get_prefixed(self, prefix: str, ids: Sequence[bytes]) -> list[bytes | None]:
        # docstring inherited
        return self.remote.ref_get_prefixed(prefix, ids)

    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        # docstring inherited
        if new is not None:
            self.publish([new])
        return self.remote.ref_update(name, old, new, entry)

    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        # docstring inherited
        return self.remote.ref_iter(prefix)

    def ref_log(self, name: str) -> list[bytes]:
        # docstring inherited
        return self.remote.ref_log(name)

    def ref_histories(self, names: Sequence[str]) -> list[tuple[list[bytes], bytes | None]]:
        # docstring inherited
        return self.remote.ref_histories(names)

    def ref_log_names(self) -> Iterator[str]:
        # docstring inherited
        return self.remote.ref_log_names()

    def damage(self) -> list[tuple[str, str]]:
        # docstring inherited
        return [*self.local.damage(), *self.remote.damage()]

    def close(self) -> None:
        # docstring inherited
        try:
            self.local.close()
        finally:
            self.remote.close()
