"""`PackIndexCache`: every pack's index, merged into one in-memory map of where each key is.

Loaded on first use (one listing of ``packs/``, then the new indexes, concurrently) and
refreshed when a key is not found, so that objects another writer packed are found too.
Of several copies of a key (written twice, or by gc's rewrite before the old pack went),
the one with the newest write time wins.

Readers do not take the lock: `where` is either updated in place by a merge (adding
entries only) or replaced whole by a rebuild (after a pack is forgotten).
"""

from __future__ import annotations

import threading
import time

from medomni_cas.store.backends._packs import CorruptPack, PackIndex, parse_index
from medomni_cas.store.backends.fsspec._remote import Remote

__all__ = ["Loc", "PackIndexCache"]

#: (pack name, offset, length, write time in ms) of a packed key
Loc = tuple[str, int, int, int]


class PackIndexCache:
    """The merged index of the packs under ``packs/`` (see the module docstring)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.folder = remote.path("packs")
        self.lock = threading.Lock()
        #: pack name -> its index
        self.packs: dict[str, PackIndex] = {}
        #: key -> where its newest copy is
        self.where: dict[bytes, Loc] = {}
        #: monotonic time of the last listing (None: never listed)
        self.refreshed_at: float | None = None
        self._keys: dict[str, frozenset[bytes]] = {}
        self._known_at: dict[str, float] = {}

    def pack_path(self, name: str, ext: str) -> str:
        """The path of pack ``name``'s file (``ext`` "pack") or index ("idx")."""
        return f"{self.folder}/{name}.{ext}"

    def ensure(self) -> None:
        """Load the index if it never was."""
        if self.refreshed_at is None:
            self.refresh()

    def refresh(self) -> None:
        """Re-list ``packs/``: fetch indexes written since the last listing, drop deleted ones."""
        started = time.monotonic()
        listed = set()
        for path in self.remote.list(self.folder):
            stem, dot, ext = path.rsplit("/", 1)[-1].partition(".")
            if dot and ext == "idx":
                listed.add(stem)
        new = sorted(n for n in listed if n not in self.packs)
        paths = [self.pack_path(n, "idx") for n in new]
        parsed: list[PackIndex] = []
        for name, path, data in zip(new, paths, self.remote.cat_whole(paths), strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing (gc rewrote the pack)
            if isinstance(data, BaseException):
                raise OSError(
                    f"{self.remote.url}: reading pack index {path} failed: {data}"
                ) from data
            idx = parse_index(data, path)
            if idx.name != name:
                raise CorruptPack(path, f"this index describes pack {idx.name}, not {name}")
            parsed.append(idx)
        with self.lock:
            for idx in parsed:
                self.packs.setdefault(idx.name, idx)
                self._known_at.setdefault(idx.name, started)
            # a pack written by this process after the listing started is not gone
            gone = [n for n in self.packs if n not in listed and self._known_at[n] < started]
            for n in gone:
                self._forget(n)
            if gone:
                self._rebuild()
            else:
                for idx in parsed:
                    self._merge(idx, self.where)
            self.refreshed_at = started

    def add(self, idx: PackIndex) -> None:
        """A pack this process has just written (index last)."""
        with self.lock:
            self.packs[idx.name] = idx
            self._known_at[idx.name] = time.monotonic()
            self._merge(idx, self.where)

    def forget(self, *names: str) -> None:
        """Packs that are gone (rewritten by gc or repack, here or elsewhere)."""
        with self.lock:
            for name in names:
                self._forget(name)
            self._rebuild()

    def rebuild(self) -> None:
        """Merge `packs` again from scratch (after they were changed in place)."""
        with self.lock:
            self._rebuild()

    def keys_of(self, name: str) -> frozenset[bytes]:
        """The keys in pack ``name``."""
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = frozenset(self.packs[name].keys)
        return keys

    def keys(self, hex_prefix: str = "") -> set[bytes]:
        """Every packed key whose hex form starts with ``hex_prefix``."""
        with self.lock:
            return {k for k in self.where if k.hex().startswith(hex_prefix)}

    def stamps(self) -> dict[bytes, float]:
        """Every packed key with its write time (epoch seconds)."""
        with self.lock:
            return {k: loc[3] / 1000.0 for k, loc in self.where.items()}

    @staticmethod
    def _merge(idx: PackIndex, where: dict[bytes, Loc]) -> None:
        name = idx.name
        for key, off, length, stamp in zip(
            idx.keys, idx.offsets, idx.lengths, idx.stamps, strict=True
        ):
            old = where.get(key)
            if old is None or stamp > old[3]:
                where[key] = (name, off, length, stamp)

    def _rebuild(self) -> None:
        # built aside and swapped in: readers do not take the lock
        where: dict[bytes, Loc] = {}
        for idx in self.packs.values():
            self._merge(idx, where)
        self.where = where

    def _forget(self, name: str) -> None:
        self.packs.pop(name, None)
        self._keys.pop(name, None)
        self._known_at.pop(name, None)
