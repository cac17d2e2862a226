"""Sets and lists of ids that spill to disk beyond a bound, so a walk's memory stays flat.

A walk over a store of 100M objects would otherwise hold every id it met (about 100 B
each in a Python set) and whole levels of the DAG as lists. Here both stay in memory up
to a bound (`spill_bound`: ``MEDOMNI_SPILL_IDS``, default 131,072 ids), below which they
are the plain set and list they were, at the same speed; past it they move to a
temporary directory (``TMPDIR``), removed when they are closed:

`MarkSet`
    the ids met: a Python set, then the ids met since it last wrote (a set, up to the
    bound) and sorted runs of ids in files, merged two by two as they grow; a walk gives
    it a whole level of links at once (`MarkSet.defer`, `MarkSet.settle`) and it answers
    in one pass over each first byte's ids, read with ``pread``;
`IdList`
    one level of a walk, iterated in batches in the order a walk reads it (sorted, the
    order of LMDB's keys: neighbouring ids share B-tree leaves, read once for all of
    them): a list, then sorted runs appended to a file, each cut by first byte, a byte's
    runs sorted together when it is read back.

Neither changes an answer: the same ids come out in the same order either way (the tests
force a tiny bound and compare). Neither maps its files, so what they read is the page
cache's, not the process's RSS. A spilled send plan (`medomni_cas.store._sendplan`) keeps
its records in the same sorted runs (`Run`, of wider records).

Why not a temporary LMDB (the marks were in one until fsck of a store of 1.6M objects
took 6.4 times as long as one of 400k, RESULTS.md, stop 16; a send plan's until its map
was half of push's RSS at 1.44M objects, stop 26): past a few hundred
thousand ids its pages are more than the mapped budget, so each lookup of a new link is a
page fault, and each new id a B-tree insertion. A level's links sorted by first byte
and matched against each run's ids of that byte cost a sequential read of the set per
level, and a walk of a store has a handful of large levels.
"""

from __future__ import annotations

import operator
import os
import shutil
import struct
import tempfile
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import compress, filterfalse
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from medomni_cas.store._fast import unseen
from medomni_cas.store.ids import ID_SIZE

__all__ = [
    "DEFAULT_BOUND",
    "IDS",
    "IdList",
    "MarkSet",
    "Run",
    "by_first_byte",
    "positions",
    "scratch",
    "spill_bound",
    "split",
]

#: Ids held in memory by one set or list before it spills (about 13 MB as a set).
DEFAULT_BOUND = 1 << 17
_ENV = "MEDOMNI_SPILL_IDS"
_FIRST_BYTE = operator.itemgetter(0)
#: ids as numpy bytes (S32): searched and sorted, never given back as values (S drops
#: trailing zero bytes), only as positions or raw bytes
IDS = np.dtype(f"S{ID_SIZE}")
#: a byte's records read whole unless fewer keys than its records / this are asked: each
#: then by a binary search of reads (about 24 of them), where a read of the whole byte
#: and numpy's search cost about that much per 2,000 records
_SCAN = 2048


def spill_bound() -> int:
    """The bound from the environment (``MEDOMNI_SPILL_IDS``), else `DEFAULT_BOUND`."""
    raw = os.environ.get(_ENV, "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_BOUND
    except ValueError:
        raise ValueError(f"{_ENV} must be a whole number of ids, not {raw!r}") from None


def scratch(prefix: str) -> Path:
    """A fresh temporary folder under TMPDIR (the caller's to remove), for `unnamed` files."""
    return Path(tempfile.mkdtemp(prefix=f"medomni-{prefix}-"))


def unnamed(folder: Path) -> BinaryIO:
    """A new file in ``folder`` with no name (read and written through its descriptor):
    gone with the process however it ends. A killed push of 1.44M objects left its spool
    and runs, over 500 MiB, in TMPDIR for good; now it leaves an empty folder."""
    return tempfile.TemporaryFile(dir=folder)


class Run:
    """Sorted records in one file, each an id and ``width - 32`` bytes about it (none, for
    a run of ids), with where each first byte's records start: read with ``pread`` (the
    page cache's, never mapped into the process). An id is in a run at most once."""

    def __init__(self, file: BinaryIO, starts: list[int], width: int = ID_SIZE) -> None:
        self._file = file  # an `unnamed` one, its bytes written
        self.starts = starts  # the index of the first record of each first byte, and the end
        self.width = width
        self.n = starts[-1]
        self._fd = file.fileno()

    @classmethod
    def write(cls, folder: Path, records: list[bytes] | bytes, width: int = ID_SIZE) -> Run:
        """A run of ``records`` (sorted, each ``width`` bytes, or such records end to end)
        written to a file in ``folder``."""
        data = records if isinstance(records, bytes) else b"".join(records)
        f = unnamed(folder)
        try:
            f.write(data)
            f.flush()
        except BaseException:
            f.close()
            raise
        return cls(f, byte_starts(data, width), width)

    @classmethod
    def merged(cls, folder: Path, older: Run, newer: Run) -> Run:
        """One run of the records of both, written to a file in ``folder`` (where both hold
        an id, ``newer``'s record), a byte at a time: only one byte's records of each are
        held. Both are closed."""
        width = newer.width
        starts, n = [], 0
        f = unnamed(folder)
        try:
            for byte in range(256):
                starts.append(n)
                a, b = older.raw(byte), newer.raw(byte)
                if not a or not b:
                    merged = a or b
                else:
                    # newer's first, then a stable sort by id: of an id in both, the record
                    # kept is the first of its equals, newer's (ids alone are never in both)
                    both = np.concatenate((_records(b, width), _records(a, width)))
                    both = both[np.argsort(both["id"], kind="stable")]
                    ids = both["id"]
                    if len(ids) > 1:
                        both = both[np.concatenate(([True], ids[1:] != ids[:-1]))]
                    merged = both.tobytes()
                f.write(merged)
                n += len(merged) // width
            f.flush()
        except BaseException:
            f.close()
            raise
        older.close()
        newer.close()
        return cls(f, [*starts, n], width)

    def ids(self, byte: int) -> list[bytes]:
        """The records of this first byte, sorted (for a run of ids, its ids)."""
        return split(self.raw(byte), self.width)

    def raw(self, byte: int) -> bytes:
        """The records of this first byte as they are stored, end to end."""
        lo, hi = self.starts[byte], self.starts[byte + 1]
        w = self.width
        return os.pread(self._fd, (hi - lo) * w, lo * w)

    def found(self, byte: int, keys: list[bytes]) -> dict[bytes, bytes]:
        """What the record of each of ``keys`` (all of first byte ``byte``) that is here
        says about it (the record without its id)."""
        lo, hi = self.starts[byte], self.starts[byte + 1]
        if lo == hi or not keys:
            return {}
        if len(keys) * _SCAN < hi - lo:
            return {k: r[ID_SIZE:] for k in keys if (r := self._find(k, lo, hi)) is not None}
        here = _records(self.raw(byte), self.width)
        at = positions(here["id"], _asked(keys))
        hits = np.flatnonzero(at >= 0)
        rest = here["rest"][at[hits]].tolist()
        return dict(zip([keys[i] for i in hits.tolist()], rest, strict=True))

    def present(self, byte: int, keys: list[bytes]) -> set[bytes]:
        """Those of ``keys`` (all of first byte ``byte``) that are here."""
        lo, hi = self.starts[byte], self.starts[byte + 1]
        if lo == hi or not keys:
            return set()
        if len(keys) * _SCAN < hi - lo:  # a few keys: looked up, not the byte read whole
            return {k for k in keys if self._find(k, lo, hi) is not None}
        here = _records(self.raw(byte), self.width)["id"]
        return set(compress(keys, (positions(here, _asked(keys)) >= 0).tolist()))

    def _find(self, key: bytes, lo: int, hi: int) -> bytes | None:
        fd, w = self._fd, self.width
        while lo < hi:
            mid = (lo + hi) // 2
            got = os.pread(fd, w, mid * w)
            here = got[:ID_SIZE]
            if here < key:
                lo = mid + 1
            elif here > key:
                hi = mid
            else:
                return got
        return None

    def close(self) -> None:
        self._file.close()


def split(data: bytes, width: int = ID_SIZE) -> list[bytes]:
    """``data`` cut into records of ``width`` bytes (a whole number of them)."""
    # one C-level unpack of "32s32s...": about 4x a slice per record in Python (struct
    # keeps the compiled formats it was given last)
    n, cut = divmod(len(data), width)
    if cut:
        raise OSError(f"a spill file read {len(data)} bytes, not whole {width}-byte records")
    return list(struct.unpack(f"{width}s" * n, data)) if n else []


def sorted_ids(ids: list[bytes]) -> bytes:
    """``ids`` (32 bytes each) sorted, end to end: numpy's sort of them as S32, about a
    third of the time of Python's sort of the list (each comparison a call), and one
    buffer to write instead of a list to join."""
    if set(map(len, ids)) - {ID_SIZE}:
        raise ValueError("a spilled set or level holds 32-byte ids only")
    return np.sort(np.frombuffer(b"".join(ids), IDS)).tobytes()


def byte_starts(data: bytes, width: int = ID_SIZE) -> list[int]:
    """Where each first byte's records start in the sorted records ``data`` (each
    ``width`` bytes), and their number at the end: 257 indexes."""
    n, cut = divmod(len(data), width)
    if cut:
        raise ValueError(f"{len(data)} bytes are not whole {width}-byte records")
    first = np.frombuffer(data, np.uint8)[::width]
    return [*np.searchsorted(first, np.arange(256, dtype=np.uint8)).tolist(), n]


def _records(data: bytes, width: int) -> npt.NDArray[np.void]:
    """Records end to end in ``data`` as a numpy array of ``id`` (S32) and ``rest``."""
    n, cut = divmod(len(data), width)
    if cut:
        raise OSError(f"a spill file read {len(data)} bytes, not whole {width}-byte records")
    if width == ID_SIZE:
        kind = np.dtype([("id", IDS)])
    else:
        kind = np.dtype([("id", IDS), ("rest", f"V{width - ID_SIZE}")])
    return np.frombuffer(data, kind, n)


def positions(here: npt.NDArray[np.bytes_], ask: npt.NDArray[np.bytes_]) -> npt.NDArray[np.intp]:
    """Where each of the ids ``ask`` is in the sorted ids ``here`` (-1: not there), by
    numpy's binary search: C-level, where a dict of a byte's records cost a Python object
    each. S32 compares as bytes do for ids of one length (its zero padding is never seen:
    both sides are 32 bytes, and only positions come back, never S32 values)."""
    at = np.searchsorted(here, ask)
    inside = at < len(here)
    inside[inside] = here[at[inside]] == ask[inside]
    return np.where(inside, at, -1)


def _asked(keys: list[bytes]) -> npt.NDArray[np.bytes_]:
    return np.frombuffer(b"".join(keys), IDS)


def by_first_byte(keys: Iterable[bytes]) -> dict[int, list[bytes]]:
    """Each first byte of ``keys`` and its keys, sorted, in byte order: a sort (linear for
    keys that come sorted, as a listing's do) and a bisection per byte, C-level passes
    where a loop per key cost gc's sweep of 1.6M listed keys 0.8 s."""
    return dict(_byte_parts(sorted(keys)))


def _byte_parts(held: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """Each first byte of the sorted ``held`` and its ids, in order: a bisection per byte."""
    i, n = 0, len(held)
    while i < n:
        byte = held[i][0]
        j = bisect_left(held, byte + 1, lo=i, key=_FIRST_BYTE)
        yield byte, held[i:j]
        i = j


class MarkSet:
    """The ids a walk has met: `unseen` adds a batch and says which were new.

    Past its bound the set is the ids met since it last wrote (in memory, up to the bound)
    and sorted runs on disk (`Run`), merged two by two as they come (a binary counter: at
    most log2(n / bound) + 1 runs, each id rewritten that many times at most). An id is
    looked for run by run, first byte by first byte: a few by binary search, many by
    reading the byte's ids of each run once. So a walk that asks for a whole level at once
    (`defer`, then `settle`) reads what it met once per level, in order, instead of a
    random lookup per link; `unseen` and `absent` answer at once, at a lookup per id (or
    per first byte, for many).
    """

    def __init__(self, bound: int | None = None) -> None:
        self.bound = spill_bound() if bound is None else bound
        self._mem: set[bytes] = set()  # every id met, or (spilled) those since the last run
        self._dir: Path | None = None
        self._runs: list[Run] = []
        self._n = 0

    def __enter__(self) -> MarkSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._dir is not None

    def __len__(self) -> int:
        return self._n + len(self._mem)

    def __contains__(self, key: object) -> bool:
        if key in self._mem:
            return True
        if not isinstance(key, bytes) or len(key) != ID_SIZE:
            return False
        return any(run.present(key[0], [key]) for run in self._runs)

    def unseen(self, ids: Iterable[bytes]) -> list[bytes]:
        """The ``ids`` not met before (each once, in the order of ``ids``), now met."""
        if self._dir is None:
            new = list(unseen(self._mem, list(ids)))
            if len(self._mem) > self.bound:
                self._spill()
            return new
        fresh = list(filterfalse(self._mem.__contains__, dict.fromkeys(ids)))
        met = self._on_disk(fresh)
        new = list(filterfalse(met.__contains__, fresh)) if met else fresh
        self._met(new)
        return new

    def add(self, ids: Iterable[bytes]) -> None:
        self.unseen(ids)

    def absent(self, keys: list[bytes]) -> list[bytes]:
        """Those of ``keys`` not met, in order (repeats kept)."""
        maybe = list(filterfalse(self._mem.__contains__, keys))
        if not self._runs:
            return maybe
        met = self._on_disk(maybe)
        return list(filterfalse(met.__contains__, maybe)) if met else maybe

    def defer(self, ids: Iterable[bytes], pending: IdList) -> None:
        """Put in ``pending`` those of ``ids`` that may not have been met (not in memory),
        for `settle` to decide in one pass: the spilled set's way to take a whole level."""
        pending.extend(filterfalse(self._mem.__contains__, dict.fromkeys(ids)))

    def settle(self, pending: IdList, into: IdList) -> None:
        """Put in ``into`` the ids of ``pending`` not met before, each once (sorted, as
        ``into`` keeps them anyway); they are met now."""
        for byte, keys in pending.by_first_byte():
            fresh = list(filterfalse(self._mem.__contains__, dict.fromkeys(keys)))
            met = self._in_runs(byte, fresh)
            if met:
                fresh = list(filterfalse(met.__contains__, fresh))
            into.extend(fresh)
            self._met(fresh)

    def _on_disk(self, keys: list[bytes]) -> set[bytes]:
        """Those of ``keys`` in the runs on disk."""
        out: set[bytes] = set()
        if keys and self._runs:
            for byte, part in by_first_byte(keys).items():
                out |= self._in_runs(byte, part)
        return out

    def _in_runs(self, byte: int, keys: list[bytes]) -> set[bytes]:
        """Those of ``keys`` (all of first byte ``byte``) in some run on disk."""
        out: set[bytes] = set()
        for run in self._runs:
            if keys:
                out |= run.present(byte, keys)
        return out

    def _met(self, new: list[bytes]) -> None:
        self._mem.update(new)
        # once spilled, a quarter of the bound: a walk's level and its pending links are
        # held beside it then, each up to its own bound
        if len(self._mem) > max(1, self.bound // 4):
            self._spill()

    def _spill(self) -> None:
        """Write what is in memory as a run, then merge the last two runs while the older
        is no larger than the newer."""
        if self._dir is None:
            self._dir = scratch("marks")
        self._runs.append(Run.write(self._dir, sorted_ids(list(self._mem))))
        self._n += len(self._mem)
        self._mem = set()
        while len(self._runs) >= 2 and self._runs[-2].n <= self._runs[-1].n:
            newer, older = self._runs.pop(), self._runs.pop()
            self._runs.append(self._merged(older, newer))

    def _merged(self, a: Run, b: Run) -> Run:
        assert self._dir is not None
        return Run.merged(self._dir, a, b)

    def close(self) -> None:
        self._mem = set()
        for run in self._runs:
            run.close()
        self._runs = []
        self._n = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class IdList:
    """One level of a walk: ids appended, read back in batches, sorted (LMDB's key
    order), the order a walk reads them in."""

    def __init__(self, ids: Iterable[bytes] = (), bound: int | None = None) -> None:
        self.bound = spill_bound() if bound is None else bound
        self._mem: list[bytes] = []
        self._dir: Path | None = None
        self._file: BinaryIO | None = None
        # per first byte: the (offset, count) of each run written to the file, in order
        self._runs: list[list[tuple[int, int]]] = []
        self._n = 0
        self._sorted = False
        self.extend(ids)

    def __enter__(self) -> IdList:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def extend(self, ids: Iterable[bytes]) -> None:
        before = len(self._mem)
        self._mem.extend(ids)
        self._n += len(self._mem) - before
        self._sorted = False
        if len(self._mem) > self.bound:
            self._flush()

    def _flush(self) -> None:
        if self._file is None:
            self._dir = scratch("level")
            self._file = unnamed(self._dir)
            self._runs = [[] for _ in range(256)]
        data = sorted_ids(self._mem)
        starts = byte_starts(data)
        f = self._file
        base = f.seek(0, os.SEEK_END)
        f.write(data)
        for byte in range(256):  # each byte's run of ids
            lo, hi = starts[byte], starts[byte + 1]
            if hi > lo:
                self._runs[byte].append((base + lo * ID_SIZE, hi - lo))
        self._mem = []

    def batches(self, size: int) -> Iterator[list[bytes]]:
        """Every id in walk order (see the class), ``size`` at a time; may be read again."""
        if self._file is None:
            if not self._sorted:
                self._mem.sort()
                self._sorted = True
            for i in range(0, len(self._mem), size):
                yield self._mem[i : i + size]
            return
        out: list[bytes] = []
        for _, ids in self._spilled_bytes():
            out += ids
            while len(out) >= size:
                yield out[:size]
                out = out[size:]
        if out:
            yield out

    def by_first_byte(self) -> Iterator[tuple[int, list[bytes]]]:
        """Each first byte met and its ids, in walk order (one byte's ids held at a time)."""
        if self._file is None:
            held = self.as_list()
            assert held is not None
            yield from _byte_parts(held)
            return
        yield from self._spilled_bytes()

    def _spilled_bytes(self) -> Iterator[tuple[int, list[bytes]]]:
        """Each first byte in the file and its ids, sorted (the ids held written first)."""
        if self._mem:
            self._flush()
        f = self._file
        assert f is not None
        fd = f.fileno()
        f.flush()
        for byte, runs in enumerate(self._runs):
            if runs:
                data = b"".join(os.pread(fd, count * ID_SIZE, offset) for offset, count in runs)
                if len(data) != sum(count for _, count in runs) * ID_SIZE:
                    raise OSError(f"a spilled level's file gave {len(data)} bytes of byte {byte}")
                if len(runs) > 1:  # sorted runs end to end, sorted together
                    data = np.sort(np.frombuffer(data, IDS)).tobytes()
                yield byte, split(data)

    def as_list(self) -> list[bytes] | None:
        """The ids in walk order as the list held, when it is not spilled."""
        if self._file is not None:
            return None
        if not self._sorted:
            self._mem.sort()
            self._sorted = True
        return self._mem

    def close(self) -> None:
        self._mem = []
        self._n = 0
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
