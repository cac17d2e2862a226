"""`PackIndexCache`: every pack's index, merged into one in-memory map of where each key is.

Loaded on first use (one listing of ``packs/``, then the new indexes, concurrently) and
refreshed when a key is not found, so that objects another writer packed are found too.
Of several copies of a key (written twice, or by gc's rewrite before the old pack went),
the one with the newest write time wins.

Readers do not take the lock: `where` is either updated in place by a merge (adding
entries only) or replaced whole by a rebuild (after a pack is forgotten).

A damaged index does not make the store unreadable: it is made again from its pack
(`index_from_pack`) and written back in place of the damaged one (only if that is still
there, unchanged: gc may be removing the pack); an index whose pack is gone or damaged too
is left out, so that only its objects are missing. Either way `damaged` says so, for fsck.
"""

from __future__ import annotations

import threading
import time

from medomni_cas.store.backends._packs import CorruptPack, PackIndex, index_from_pack, parse_index
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
        #: index file -> what was wrong with it and what was done (rebuilt, or left out)
        self.damaged: dict[str, str] = {}
        self._left_out: set[str] = set()  # packs whose index could not be made again

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
        new = sorted(n for n in listed if n not in self.packs and n not in self._left_out)
        paths = [self.pack_path(n, "idx") for n in new]
        parsed: list[PackIndex] = []
        for name, path, data in zip(new, paths, self.remote.cat_whole(paths), strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # deleted since the listing (gc rewrote the pack)
            if isinstance(data, BaseException):
                raise OSError(
                    f"{self.remote.url}: reading pack index {path} failed: {data}"
                ) from data
            try:
                idx = parse_index(data, path)
                if idx.name != name:
                    raise CorruptPack(path, f"this index describes pack {idx.name}, not {name}")
            except CorruptPack as damage:
                remade = self._remake(name, path, damage)
                if remade is None:
                    continue
                idx = remade
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

    def _remake(self, name: str, path: str, damage: CorruptPack) -> PackIndex | None:
        """Pack ``name``'s index made again from the pack and written back over the damaged
        one at ``path``; None (the pack left out) when the pack is gone or damaged too."""
        pack_path = self.pack_path(name, "pack")
        (stamp,) = self.remote.mtimes([pack_path])
        data = None if stamp is None else self.remote.cat_whole([pack_path])[0]
        if stamp is None or data is None or isinstance(data, FileNotFoundError):
            self._left_out.add(name)
            self.damaged[path] = f"{damage}; its pack is gone, so its objects are missing"
            return None
        if isinstance(data, BaseException):
            raise OSError(f"{self.remote.url}: reading pack {pack_path} failed: {data}") from data
        try:
            # the pack file's time: no older than any of its objects, so gc keeps them
            idx, idx_bytes = index_from_pack(data, pack_path, int(stamp * 1000))
        except CorruptPack as e:
            self._left_out.add(name)
            self.damaged[path] = f"{damage}; it cannot be made again ({e}): its objects are missing"
            return None
        note = "" if self._write_back(path, idx_bytes) else " (in memory only: not written back)"
        self.damaged[path] = f"{damage}; rebuilt from its pack, {len(idx.keys)} objects{note}"
        return idx

    def _write_back(self, path: str, data: bytes) -> bool:
        """Replace the damaged index at ``path``, if it is still the one read."""
        try:
            old, etag = self.remote.read_versioned(path)
            if old is None:
                return False  # removed meanwhile (gc rewrote the pack): nothing to repair
            return self.remote.replace(path, data, etag)
        except OSError:
            return False  # a read-only store: readers still use the index made here

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
