"""`PackFiles`: reading, writing and rewriting pack files (their format: `.._packs`).

Reading. Packed objects are read with byte ranges, neighbours in one pack merged into one
request (gaps up to `RANGE_GAP`, requests up to `RANGE_MAX`), all requests in flight at
once where the filesystem allows.

Writing. A pack is written before its index: an index's presence means its pack is
complete. A batch larger than `PACK_BYTES` writes several packs, all packs first.

Rewriting (gc, repack). Survivors, with their write times, go into a new pack and index
first; only then are the old index and pack removed, index first (without it the pack
is invisible; a pack left without one is an orphan that `remove_orphans` removes). A
reader that still knows an old pack gets a not-found on its range read, refreshes its
index and reads the new pack.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable

from medomni_cas.store.backends._packs import (
    CorruptPack,
    PackIndex,
    build_index,
    build_pack,
    parse_index,
)
from medomni_cas.store.backends.fsspec._packindex import PackIndexCache
from medomni_cas.store.backends.fsspec._remote import Remote, mtime

__all__ = ["PACK_BYTES", "RANGE_GAP", "RANGE_MAX", "PackFiles"]

#: A pack holds at most this many bytes; a larger batch writes several.
PACK_BYTES = 64 << 20
#: Range reads from one pack are merged across gaps of up to this many bytes…
RANGE_GAP = 256 * 1024
#: …into requests of at most this many bytes.
RANGE_MAX = 32 << 20

# (offset, length, key) of a packed value
_Entry = tuple[int, int, bytes]
# a pack made and not yet written: its parsed index, its bytes, its index's bytes
_Built = tuple[PackIndex, bytes, bytes]


def _build(items: list[tuple[bytes, bytes, int]]) -> _Built:
    """A pack of ``(key, bytes, write time ms)`` items, in their order, and its index."""
    pack, offsets = build_pack([d for _, d, _ in items])
    entries = [(k, off, len(d), stamp) for (k, d, stamp), off in zip(items, offsets, strict=True)]
    name, idx_bytes = build_index(pack, entries)
    return parse_index(idx_bytes, name), pack, idx_bytes


class PackFiles:
    """The pack files under ``packs/``, kept in step with ``index``."""

    def __init__(self, remote: Remote, index: PackIndexCache) -> None:
        self.remote = remote
        self.index = index

    # -- reading ---------------------------------------------------------------------------
    def read(self, keys: Iterable[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """Bytes of the packed ones of ``keys``; and the keys whose pack is gone."""
        by_pack: dict[str, list[_Entry]] = {}
        where = self.index.where
        for key in keys:
            loc = where.get(key)
            if loc is not None:
                by_pack.setdefault(loc[0], []).append((loc[1], loc[2], key))
        out: dict[bytes, bytes] = {}
        todo: list[tuple[str, int, int, list[_Entry]]] = []
        for name, entries in by_pack.items():
            for req in self._ranges(self.index.pack_path(name, "pack"), entries):
                if req[2] == req[1]:  # only empty values: nothing to fetch
                    out.update((key, b"") for _, _, key in req[3])
                else:
                    todo.append(req)
        gone: list[bytes] = []
        results = self.remote.cat_ranges([(p, s, e) for p, s, e, _ in todo])
        for (path, start, end, group), data in zip(todo, results, strict=True):
            if isinstance(data, FileNotFoundError):
                gone.extend(key for _, _, key in group)
                continue
            if isinstance(data, OSError) and data.errno == errno.EINVAL:
                # s3: 416, the range starts past the end of the file
                raise CorruptPack(path, f"pack is truncated: bytes {start}-{end} asked ({data})")
            if isinstance(data, BaseException):
                raise OSError(f"{self.remote.url}: reading {path} failed: {data}") from data
            if len(data) != end - start:
                raise CorruptPack(
                    path,
                    f"pack is truncated: bytes {start}-{end} asked for, {len(data)} read",
                )
            for off, length, key in group:
                out[key] = data[off - start : off - start + length]
        return out, gone

    @staticmethod
    def _ranges(path: str, entries: list[_Entry]) -> Iterable[tuple[str, int, int, list[_Entry]]]:
        """``(path, start, end, entries)``: the requests that read ``entries`` of one pack."""
        entries.sort()
        group: list[_Entry] = []
        start = end = 0
        for off, length, key in entries:
            if group and off - end <= RANGE_GAP and max(end, off + length) - start <= RANGE_MAX:
                end = max(end, off + length)
                group.append((off, length, key))
                continue
            if group:
                yield path, start, end, group
            group, start, end = [(off, length, key)], off, off + length
        if group:
            yield path, start, end, group

    def _read_whole(self, idx: PackIndex) -> bytes | None:
        """All of pack ``idx``'s bytes; None when it is gone (rewritten meanwhile)."""
        path = self.index.pack_path(idx.name, "pack")
        data: bytes | BaseException = self.remote.cat_ranges([(path, 0, idx.pack_size)])[0]
        if isinstance(data, FileNotFoundError):
            return None
        if isinstance(data, BaseException):
            raise OSError(f"{self.remote.url}: reading {path} failed: {data}") from data
        if len(data) != idx.pack_size:
            raise CorruptPack(path, f"pack is truncated: {len(data)} of {idx.pack_size} bytes")
        return data

    # -- writing ---------------------------------------------------------------------------
    def write(self, items: list[tuple[bytes, bytes]], now_ms: int) -> None:
        """Write ``items`` as packs of at most `PACK_BYTES`, all stamped ``now_ms``."""
        groups: list[list[tuple[bytes, bytes]]] = [[]]
        size = 0
        for item in items:
            if groups[-1] and size + len(item[1]) > PACK_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += len(item[1])
        self._put([_build([(k, d, now_ms) for k, d in group]) for group in groups if group])

    def _put(self, built: list[_Built]) -> None:
        """Write built packs: all packs, then all indexes (an index's presence means its
        pack is complete)."""
        if not built:
            return
        path = self.index.pack_path
        self.remote.pipe_many([(path(i.name, "pack"), pack) for i, pack, _ in built])
        self.remote.pipe_many([(path(i.name, "idx"), idx) for i, _, idx in built])
        for idx, _, _ in built:
            self.index.add(idx)

    def _remove(self, names: list[str]) -> None:
        """Remove packs whose survivors are safe elsewhere: indexes first, then packs."""
        self.remote.rm([self.index.pack_path(n, "idx") for n in names])
        self.remote.rm([self.index.pack_path(n, "pack") for n in names])
        self.index.forget(*names)

    # -- rewriting -------------------------------------------------------------------------
    def drop(self, doomed: set[bytes]) -> None:
        """Remove ``doomed`` keys from every pack holding one (see the module docstring)."""
        index = self.index
        affected = [n for n in list(index.packs) if not index.keys_of(n).isdisjoint(doomed)]
        for name in affected:
            idx = index.packs[name]
            keep = [
                (k, off, length, stamp)
                for k, off, length, stamp in zip(
                    idx.keys, idx.offsets, idx.lengths, idx.stamps, strict=True
                )
                if k not in doomed
            ]
            if keep:
                data = self._read_whole(idx)
                if data is None:
                    index.forget(name)  # another gc rewrote it first
                    continue
                built = _build([(k, data[off : off + n], stamp) for k, off, n, stamp in keep])
                if built[0].name == name:  # the same bytes: only empty values were doomed
                    continue
                self._put([built])
            self._remove([name])

    def repack(self, small: int) -> int:
        """Merge every pack under ``small`` bytes into packs of up to `PACK_BYTES`; return
        how many packs were merged away."""
        self.index.refresh()
        victims = sorted(
            (idx for idx in self.index.packs.values() if idx.pack_size < small),
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
                merged += self._merge(group)
            group, size = ([idx], idx.pack_size) if idx is not None else ([], 0)
        return merged

    def _merge(self, group: list[PackIndex]) -> int:
        datas = self.remote.cat_ranges(
            [(self.index.pack_path(idx.name, "pack"), 0, idx.pack_size) for idx in group]
        )
        newest: dict[bytes, tuple[bytes, int]] = {}
        done: list[PackIndex] = []
        for idx, data in zip(group, datas, strict=True):
            path = self.index.pack_path(idx.name, "pack")
            if isinstance(data, FileNotFoundError):
                continue  # gone meanwhile (gc or another repack rewrote it)
            if isinstance(data, BaseException):
                raise OSError(f"{self.remote.url}: reading {path} failed: {data}") from data
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
        self._put([_build([(k, d, stamp) for k, (d, stamp) in newest.items()])])
        self._remove([idx.name for idx in done])
        return len(done)

    def remove_orphans(self, older_than: float) -> int:
        """Pack files without an index (a writer or gc died between the two), older than
        ``older_than``; return how many were removed."""
        listing = self.remote.list(self.index.folder)
        stems = {p.rsplit("/", 1)[-1].partition(".")[0] for p in listing if p.endswith(".idx")}
        orphans = [
            p
            for p, info in listing.items()
            if p.endswith(".pack")
            and p.rsplit("/", 1)[-1].partition(".")[0] not in stems
            and mtime(info) < older_than
        ]
        self.remote.rm(orphans)
        return len(orphans)
