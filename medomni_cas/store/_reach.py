"""What a store's refs reach, from one pass over the store: its listing on disk, a mark per object.

gc's mark as a walk (`medomni_cas.store.verify.CheckedWalk`) reads each object where its
level finds it: a read per object, the B-tree's pages mapped again after every drop of the
mapped budget (`medomni_cas.store._mapped`), so that gc of a store 16 times as large took
1.4 times as long per object (1.6M objects against 100k; RESULTS.md, stop 31). Here the
store is read once, in key order (`Backend.iter_stamped_parts`: each leaf mapped once, as
fsck's pass), and what a mark and a sweep need of it is kept on disk in the order read
(`Listing`): each object's key, write time and links. An object is then its position in
the listing, and the mark one byte per object (numpy booleans, and one more for the level
being marked: 100M objects, 200 MB, where a set of their ids was 10 GB); on disk in
TMPDIR, 48 bytes per object and 32 per link. Links are found among the keys a first byte
at a time (that byte's keys read with ``pread`` and searched by numpy), so about a 256th
of the keys and links is held at once; the links of a level wait in `ByteRuns`, which
spill to disk beyond a bound.

The listing must come in key order, as LMDB's does: one that does not (a dict's, a
folder's) raises `Unordered` and the caller marks by the walk instead. An id a link names
that the listing does not hold (missing, or written after the pass went by) is read
directly (``read``), so an object put during the pass still has its links followed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from itertools import batched
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import numpy.typing as npt

from medomni_cas.store._fast import BatchChecker, Findings
from medomni_cas.store._spill import IDS, MarkSet, positions, spill_bound, split, unnamed
from medomni_cas.store.ids import ID_SIZE
from medomni_cas.store.verify import CORRUPT, MALFORMED

if TYPE_CHECKING:
    from medomni_cas.store.store import Progress

__all__ = ["ByteRuns", "Listing", "Reach", "Unordered"]

type Rows = npt.NDArray[np.uint8]  # ids as rows of 32 bytes
type Ids = npt.NDArray[np.bytes_]  # ids as numpy S32 (sorted, searched; never .tolist())
type Parts = Iterable[tuple[list[bytes], list[bytes | None], list[float]]]
#: read ids not in the listing: their findings (links with owners)
type Reader = Callable[[list[bytes]], Findings]


class Unordered(Exception):
    """The listing is not in key order, or holds a key that is not an id."""


def _pread(fd: int, n: int, offset: int) -> bytes:
    """Exactly ``n`` bytes at ``offset`` (pread may return fewer for a large read)."""
    parts = []
    while n > 0:
        got = os.pread(fd, n, offset)
        if not got:
            raise OSError(f"a scratch file ended {n} bytes early")
        parts.append(got)
        n -= len(got)
        offset += len(got)
    return b"".join(parts)


def _rows(ids: list[bytes]) -> Rows:
    joined = b"".join(ids)
    if len(joined) != ID_SIZE * len(ids):
        raise Unordered
    return np.frombuffer(joined, np.uint8).reshape(-1, ID_SIZE)


class Listing:
    """Every object of one pass over a store, in key order, in four files: its key, its
    write time, where its links start, and the links end to end (written by `add`, then
    read a first byte at a time once `done`)."""

    def __init__(self, folder: Path) -> None:
        self._out: dict[str, BinaryIO] = {
            name: unnamed(folder) for name in ("keys", "stamps", "offsets", "links")
        }
        self._fds: dict[str, int] = {}
        self.n = 0  # objects listed
        self.links = 0
        self._last = b""
        self._per_byte = np.zeros(256, np.int64)
        self.starts: list[int] = []  # the position of each first byte's first key, and n
        #: position -> (key, kind, detail): what could not be read as an object
        self.bad: dict[int, tuple[bytes, str, str]] = {}
        self.absent: list[int] = []  # listed, then not read (deleted since)

    def add(self, keys: list[bytes], stamps: list[float], found: Findings) -> None:
        """One part of the pass: its keys and write times, and what checking its bytes
        found (with owners)."""
        if not keys:
            return
        rows = _rows(keys)
        ids = rows.view(IDS).ravel()
        if (self.n and keys[0] <= self._last) or bool(np.any(ids[1:] <= ids[:-1])):
            raise Unordered
        at: dict[bytes, int] = {}
        if len(found.sound) != len(keys) or found.malformed:  # some not read, or not sound
            at = {key: i for i, key in enumerate(keys)}
        for kind, pairs in ((CORRUPT, found.corrupt), (MALFORMED, found.malformed)):
            for key, detail in pairs:
                self.bad[self.n + at[key]] = (key, kind, detail)
        self.absent += [self.n + at[key] for key in found.absent]
        counts = np.zeros(len(keys), np.int64)
        if found.links:
            owners = np.asarray(found.owners, np.int64)
            links = found.links
            if bool(np.any(owners[1:] < owners[:-1])):  # a key's links end to end
                order = np.argsort(owners, kind="stable")
                owners, links = owners[order], [links[i] for i in order]
            per_sound = np.bincount(owners, minlength=len(found.sound))
            if not at:
                counts = per_sound
            else:
                counts[[at[key] for key in found.sound]] = per_sound
            self._out["links"].write(_rows(links).tobytes())
        starts = self.links + np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._out["offsets"].write(starts.astype("<i8").tobytes())
        self._out["keys"].write(rows.tobytes())
        self._out["stamps"].write(np.asarray(stamps, "<f8").tobytes())
        self._per_byte += np.bincount(rows[:, 0], minlength=256)
        self.links += int(counts.sum())
        self.n += len(keys)
        self._last = keys[-1]

    def done(self) -> None:
        """The files written: read from now on (with ``pread``, past their buffers)."""
        self._out["offsets"].write(np.asarray([self.links], "<i8").tobytes())
        for name, f in self._out.items():
            f.flush()
            self._fds[name] = f.fileno()
        self.starts = [0, *np.cumsum(self._per_byte).tolist()]

    def keys(self, lo: int, hi: int) -> Ids:
        return np.frombuffer(_pread(self._fds["keys"], (hi - lo) * ID_SIZE, lo * ID_SIZE), IDS)

    def stamps(self, lo: int, hi: int) -> npt.NDArray[np.float64]:
        return np.frombuffer(_pread(self._fds["stamps"], (hi - lo) * 8, lo * 8), "<f8")

    def offsets(self, lo: int, hi: int) -> npt.NDArray[np.int64]:
        """Where the links of positions ``lo`` to ``hi`` start, and where the last ends."""
        return np.frombuffer(_pread(self._fds["offsets"], (hi - lo + 1) * 8, lo * 8), "<i8")

    def link_rows(self, lo: int, hi: int) -> Rows:
        data = _pread(self._fds["links"], (hi - lo) * ID_SIZE, lo * ID_SIZE)
        return np.frombuffer(data, np.uint8).reshape(-1, ID_SIZE)

    def find(self, byte: int, ids: Ids) -> tuple[npt.NDArray[np.int64], Ids]:
        """The positions of those of ``ids`` (sorted, of first byte ``byte``) listed, and
        those not listed."""
        lo, hi = self.starts[byte], self.starts[byte + 1]
        if lo == hi:
            return np.zeros(0, np.int64), ids
        at = positions(self.keys(lo, hi), ids)
        listed = at >= 0
        return lo + at[listed], ids[~listed]

    def close(self) -> None:
        for f in self._out.values():
            f.close()
        self._out, self._fds = {}, {}


class ByteRuns:
    """Ids gathered by first byte, each byte's read back sorted and once: in memory up to
    ``bound`` ids, then runs in a file, each run's ids grouped by first byte."""

    def __init__(self, folder: Path, bound: int) -> None:
        self._folder = folder
        self.bound = bound
        self._mem: list[Rows] = []
        self._held = 0
        self._file: BinaryIO | None = None
        self._runs: list[list[tuple[int, int]]] = [[] for _ in range(256)]
        self.n = 0

    def __bool__(self) -> bool:
        return self.n > 0

    def add(self, rows: Rows) -> None:
        if not len(rows):
            return
        self._mem.append(rows)
        self._held += len(rows)
        self.n += len(rows)
        if self._held > self.bound:
            self._flush()

    def _grouped(self) -> tuple[Rows, npt.NDArray[np.int64]]:
        """The rows held, by first byte, and where each byte's start (257 of them)."""
        rows = np.concatenate(self._mem) if len(self._mem) > 1 else self._mem[0]
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        starts = np.concatenate(([0], np.cumsum(np.bincount(rows[:, 0], minlength=256))))
        self._mem, self._held = [], 0
        return rows, starts

    def _flush(self) -> None:
        if self._file is None:
            self._file = unnamed(self._folder)
        rows, starts = self._grouped()
        f = self._file
        base = f.seek(0, os.SEEK_END)
        f.write(rows.tobytes())
        for byte in np.flatnonzero(np.diff(starts)).tolist():
            self._runs[byte].append(
                (base + int(starts[byte]) * ID_SIZE, int(starts[byte + 1] - starts[byte]))
            )

    def by_first_byte(self) -> Iterator[tuple[int, Ids]]:
        """Each first byte held and its ids, sorted, each once."""
        if self._file is None:
            if not self._mem:
                return
            rows, starts = self._grouped()
            for byte in np.flatnonzero(np.diff(starts)).tolist():
                part = rows[starts[byte] : starts[byte + 1]]
                yield byte, np.unique(np.ascontiguousarray(part).view(IDS).ravel())
            return
        if self._mem:
            self._flush()
        self._file.flush()
        fd = self._file.fileno()
        for byte, runs in enumerate(self._runs):
            if runs:
                data = b"".join(_pread(fd, count * ID_SIZE, offset) for offset, count in runs)
                yield byte, np.unique(np.frombuffer(data, IDS))

    def close(self) -> None:
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None


class Reach:
    """What ``roots`` reach among the objects of a `Listing` (`marked`, by position), and
    the objects not listed that they reach (read by ``read``)."""

    def __init__(self, listing: Listing, folder: Path, read: Reader) -> None:
        self.listing = listing
        self._folder = folder
        self._read = read
        self.bound = spill_bound()
        self.marked = np.zeros(listing.n, np.bool_)
        self.outside = MarkSet()  # ids reached that the listing does not hold
        self.read_outside = 0  # of those, the ones read
        #: corrupt or malformed objects reached that the listing does not hold
        self.bad_outside: list[tuple[bytes, str, str]] = []

    def walk(self, roots: Iterable[bytes]) -> None:
        """Mark what ``roots`` reach, a level at a time: the level's links found among the
        keys a first byte at a time, then the links of what was new."""
        pending = ByteRuns(self._folder, self.bound)
        for chunk in batched(roots, self.bound):
            pending.add(_rows(list(chunk)))
        while pending:
            level = np.zeros(self.listing.n, np.bool_)
            nxt = ByteRuns(self._folder, self.bound)
            try:
                away: list[bytes] = []
                for byte, ids in pending.by_first_byte():
                    at, outside = self.listing.find(byte, ids)
                    new = at[~self.marked[at]]
                    self.marked[new] = True
                    level[new] = True
                    away += split(outside.tobytes())
                    if len(away) >= self.bound:
                        self._outside(away, nxt)
                        away = []
                self._outside(away, nxt)
                self._links(level, nxt)
            except BaseException:
                nxt.close()
                raise
            finally:
                pending.close()
            pending = nxt

    def _links(self, level: npt.NDArray[np.bool_], into: ByteRuns) -> None:
        """Put the links of the positions in ``level`` in ``into``, a first byte at a time."""
        starts = self.listing.starts
        for byte in range(256):
            lo, hi = starts[byte], starts[byte + 1]
            new = np.flatnonzero(level[lo:hi])
            if not new.size:
                continue
            offsets = self.listing.offsets(lo, hi)
            first, end = offsets[new], offsets[new + 1]
            counts = end - first
            total = int(counts.sum())
            if not total:
                continue
            links = self.listing.link_rows(int(offsets[0]), int(offsets[-1]))
            # the rows of each new object's links, end to end: each run's start, repeated
            # along it, plus the step within it
            run_at = np.repeat(first - offsets[0] - np.cumsum(counts) + counts, counts)
            into.add(links[run_at + np.arange(total)])

    def _outside(self, ids: list[bytes], into: ByteRuns) -> None:
        """Read those of ``ids`` not read before, and put their links in ``into``."""
        new = self.outside.unseen(ids) if ids else []
        for i in range(0, len(new), 4096):
            found = self._read(new[i : i + 4096])
            self.read_outside += found.objects - len(found.corrupt)
            self.bad_outside += [(k, CORRUPT, d) for k, d in found.corrupt]
            self.bad_outside += [(k, MALFORMED, d) for k, d in found.malformed]
            if found.links:
                into.add(_rows(list(found.links)))

    def reached_bad(self) -> tuple[bytes, str, str] | None:
        """The first corrupt or malformed object reached (its links could not be read, so
        the mark is incomplete), if any."""
        for at in sorted(self.listing.bad):
            if self.marked[at]:
                return self.listing.bad[at]
        return self.bad_outside[0] if self.bad_outside else None

    @property
    def reachable(self) -> int:
        """The objects reached that could be read."""
        gone = int(self.marked[self.listing.absent].sum()) if self.listing.absent else 0
        return int(self.marked.sum()) - gone + self.read_outside

    def close(self) -> None:
        self.outside.close()


def listed(
    parts: Parts, check: BatchChecker, folder: Path, progress: Progress | None = None
) -> Listing:
    """The `Listing` of a pass (``parts``: `Backend.iter_stamped_parts`), each part
    checked by ``check`` (its hashes; links with owners)."""
    listing = Listing(folder)
    try:
        for keys, values, stamps in parts:
            listing.add(keys, stamps, check(keys, values, owners=True))
            if progress:
                progress(listing.n)
        listing.done()
    except BaseException:
        listing.close()
        raise
    return listing
