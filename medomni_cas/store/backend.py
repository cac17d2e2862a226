"""The backend interface: byte-level storage of objects and refs.

A backend stores canonical bytes under their 32-byte id and keeps refs. It knows nothing of
kinds, links or verification; `medomni_cas.store.Store` builds all of that on top. Nine
abstract methods; the batch methods have correct defaults that backends override for speed.

Contract for implementers:

* ``put_many`` is put-if-absent and idempotent: the bytes put are those of the id (the store
  hashed or checked them), so a present object is not written again, except that a stored
  copy found to differ from them is corrupt and is replaced, atomically. Look where it costs
  nothing or only on that conflict (the stored value read anyway, a size, a read of a copy
  that is present), never by reading or hashing what is absent. It may refresh the write
  time of an object that is already present (gc's grace period counts from it), and must
  leave no partially written object behind if the process dies. It returns how many keys
  were absent.
* ``ref_update`` is the one atomic step: compare the current value of a ref with ``old``
  (``None`` = absent), set it to ``new`` (``None`` = delete) and append ``entry`` to its
  history, all or nothing. Losing a race returns False; it never raises for that. The
  entry is bytes, or a function of the previous history entry's bytes (None for the
  first) that makes them: the hash chain of `medomni_cas.store.reflog`,
  which must be made inside the atomic step so that two writers cannot link the same
  predecessor.
* Backends that cannot make ``ref_update`` atomic against other processes set
  ``supports_atomic_refs = False``; the store then refuses multi-writer ref updates.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import ClassVar, Self

__all__ = ["FRESHEN_AFTER", "Backend", "Entry", "no_store"]

#: A history entry as `Backend.ref_update` takes it: its bytes, or a function of the
#: previous entry's bytes (None when there is none) that returns them.
Entry = bytes | Callable[[bytes | None], bytes]

#: An object put again has its write time refreshed only when that time is older than this
#: (seconds), so that a rebuild writes (almost) nothing while gc's grace period, which counts
#: from the write time, still protects what a writer is about to link.
FRESHEN_AFTER = 3600.0


def no_store(url: str) -> FileNotFoundError:
    """The error for a URL that holds no store, naming it."""
    return FileNotFoundError(f"no store at {url} (create one with `medomni cas init`)")


class Backend(ABC):
    """Byte-level object and ref storage. Keys are raw 32-byte ids."""

    #: Objects can be deleted (gc).
    supports_deletes: ClassVar[bool] = True
    #: ``iter_keys``, ``iter_stamps`` and the passes list keys in ascending byte order (a
    #: B-tree's): gc then marks from one pass over the store (`medomni_cas.store._reach`),
    #: where a listing in any other order is marked by a walk.
    lists_in_key_order: ClassVar[bool] = False
    #: ``ref_update`` is atomic against other writers (processes, machines); a backend may
    #: set it per instance when it depends on the filesystem it was opened on.
    supports_atomic_refs: bool = True
    #: The most objects a bulk copy (`medomni_cas.store.sync`) should give one ``put_many``
    #: (None: no limit of the backend's own): LMDB holds every page a write transaction
    #: touches in memory until it commits, about a page per object for ids spread at random.
    write_batch_items: int | None = None

    url: str = ""

    @classmethod
    def from_url(cls, url: str) -> Self:
        """The backend at ``url`` (its scheme already chose this class).

        Every backend that a URL names implements it: `medomni_cas.store.url.open_backend`
        calls it for the class registered under the URL's scheme. A backend made only by
        composing others (the cached store) has no URL of its own and keeps this default.
        """
        raise NotImplementedError(f"{cls.__name__} cannot be opened from a URL ({url!r})")

    @classmethod
    def open_at(cls, url: str, *, create: bool = True) -> Self:
        """The backend at ``url``, as `medomni_cas.store.url.open_backend` opens it.

        With ``create=False`` a URL that holds no store raises `no_store` and creates
        nothing (a reader must not make an empty store at a mistyped URL); with
        ``create=True`` a store is made there if there is none. A store that cannot be
        reached to tell is an `OSError` naming the URL. The default is ``from_url``, for
        backends that cannot tell (a store made in this process only).

        Note for implementers: override it when ``from_url`` creates the store (a local
        folder) or when a store is only found by asking (a remote one)."""
        return cls.from_url(url)

    # -- objects ---------------------------------------------------------------------------
    @abstractmethod
    def get(self, key: bytes) -> bytes:
        """The bytes stored under ``key``; `KeyError` when absent."""

    @abstractmethod
    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Store each ``(key, data)`` not yet present; return how many were new."""

    @abstractmethod
    def contains(self, key: bytes) -> bool:
        """Whether ``key`` is stored."""

    @abstractmethod
    def iter_keys(self, hex_prefix: str = "") -> Iterator[bytes]:
        """Every stored key whose hex form starts with ``hex_prefix``."""

    @abstractmethod
    def iter_stamps(self) -> Iterator[tuple[bytes, float]]:
        """Every stored key with the time (epoch seconds) it was last written."""

    @abstractmethod
    def delete_many(self, keys: Iterable[bytes], *, older_than: float | None = None) -> int:
        """Delete the keys that exist (gc only); return how many were deleted.

        With ``older_than`` (epoch seconds), a key whose write time is not older is kept:
        a writer may have put it again (refreshing its time) after gc listed it.
        """

    # -- refs ------------------------------------------------------------------------------
    @abstractmethod
    def ref_get(self, name: str) -> bytes | None:
        """The id a ref points to, or None."""

    @abstractmethod
    def ref_update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        """Atomically: if the ref equals ``old``, set it to ``new`` and log ``entry`` (see
        `Entry`)."""

    @abstractmethod
    def ref_iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """Every ``(name, id)`` whose name starts with ``prefix``, sorted by name."""

    @abstractmethod
    def ref_log(self, name: str) -> list[bytes]:
        """The history entries of a ref, oldest first (kept after the ref is deleted)."""

    def ref_log_names(self) -> Iterator[str]:
        """Every name that has a history, including deleted refs."""
        return (name for name, _ in self.ref_iter())

    # -- batch defaults (override for speed) ------------------------------------------------
    def put(self, key: bytes, data: bytes) -> bool:
        """Store one object if absent; True when it was new."""
        return self.put_many([(key, data)]) == 1

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        """``(key, bytes or None)`` for each key, in order."""
        for key in keys:
            try:
                yield key, self.get(key)
            except KeyError:
                yield key, None

    def get_list(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The bytes of each key (None where absent), in order: `get_many` as one list, for
        walks that read objects by the hundred thousand (override to skip the pairs)."""
        return [data for _, data in self.get_many(keys)]

    def get_parts(
        self, keys: Sequence[bytes], held_bytes: int
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """``keys`` and their bytes (None where absent), in order, in parts holding about
        ``held_bytes`` or fewer (one larger object is a part of its own): a walk's batch of
        small objects in one part, large ones a few at a time. Default: the sizes are not
        known before a read, so reads grow from 2 ids, each sized by the mean size of the
        last (at most 4 times as many ids): a batch of objects of one size is held within
        about twice the bound. Override where a key's size is known before its bytes."""
        part: list[bytes] = []
        got: list[bytes | None] = []
        held, i, step = 0, 0, 2
        while i < len(keys):
            ids = list(keys[i : i + step])
            values = self.get_list(ids)
            i += len(ids)
            nbytes = sum(map(len, filter(None, values)))
            if part and held + nbytes > held_bytes:
                yield part, got
                part, got, held = [], [], 0
            part += ids
            got += values
            held += nbytes
            mean = nbytes / len(ids)
            fit = int(held_bytes / 4 / mean) if mean else len(keys)
            step = max(1, min(fit, step * 4))
            if held >= held_bytes:
                yield part, got
                part, got, held = [], [], 0
        if part:
            yield part, got

    def iter_parts(
        self, held_bytes: int, size: int = 4096
    ) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
        """Every stored key and its bytes (None: listed, then not readable), in key order
        where the listing has one, in parts of at most ``size`` keys holding about
        ``held_bytes`` (as `get_parts`): a pass over the whole store. Default: the keys
        listed ``size`` at a time, then read; override where one read gives both."""
        keys = iter(self.iter_keys())
        while chunk := list(islice(keys, size)):
            yield from self.get_parts(chunk, held_bytes)

    def iter_stamped_parts(
        self, held_bytes: int, size: int = 4096
    ) -> Iterator[tuple[list[bytes], list[bytes | None], list[float]]]:
        """`iter_parts` with each key's write time (as `iter_stamps` gives it): a pass
        that both marks and sweeps (gc's). Default: the stamps listed ``size`` at a time,
        then the keys read; override where one read gives all three."""
        stamped = iter(self.iter_stamps())
        while chunk := list(islice(stamped, size)):
            when = dict(chunk)
            for keys, values in self.get_parts([key for key, _ in chunk], held_bytes):
                yield keys, values, [when[key] for key in keys]

    def missing(self, keys: Iterable[bytes]) -> list[bytes]:
        """The keys that are not stored, in order."""
        return [k for k in keys if not self.contains(k)]

    def visible_together(self, sizes: Sequence[int]) -> bool:
        """Whether one ``put_many`` of objects of these sizes makes them all visible at once
        or none (a pack on a remote store), so that objects linking each other may go in
        one call rather than children first. Default: False (each key on its own)."""
        return False

    def ref_get_many(self, names: Sequence[str]) -> list[bytes | None]:
        """What each ref points to (None where absent), in order.

        Note for implementers: the default reads one ref at a time; a backend that can read
        many in one go (one transaction, one listing) should override it. The values need
        not be one snapshot: each is some value its ref had during the call.
        """
        return [self.ref_get(name) for name in names]

    def ref_histories(self, names: Sequence[str]) -> list[tuple[list[bytes], bytes | None]]:
        """For each of ``names``, its history entries (`ref_log`) and its value (`ref_get`,
        None: absent), in order; override to read many in one go (fsck checks every ref)."""
        return [(self.ref_log(name), self.ref_get(name)) for name in names]

    def ref_get_prefixed(self, prefix: str, ids: Sequence[bytes]) -> list[bytes | None]:
        """`ref_get_many` of the names ``prefix + id.hex()`` for each of ``ids`` (32-byte ids,
        names already checked). A backend that can make its keys faster from the ids than
        from names (LMDB: the UTF-8 name is the key) should override it."""
        return self.ref_get_many([prefix + raw.hex() for raw in ids])

    def reader_url(self) -> str | None:
        """A URL that this class's ``from_url`` opens in another process on this machine to
        read the same objects while this one is open, when sharing big reads among processes
        pays (a local database; see `medomni_cas.store._fast.pool`); None when it does not."""
        return None

    def remove_orphans(self, older_than: float) -> int:
        """Remove leftovers of killed writers older than ``older_than``; return how many."""
        return 0

    def damage(self) -> list[tuple[str, str]]:
        """``(file, what was wrong)`` for each of the backend's own files (beside objects
        and refs) that it found damaged since it was opened, repaired or not: what fsck
        reports beside the objects. Default: none (a backend that keeps no such files)."""
        return []

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release handles; the backend is unusable afterwards. Closing twice is harmless."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
