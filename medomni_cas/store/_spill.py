"""Sets and lists of ids that spill to disk beyond a bound, so a walk's memory stays flat.

A walk over a store of 100M objects would otherwise hold every id it met (about 100 B
each in a Python set) and whole levels of the DAG as lists. Here both stay in memory up
to a bound (`spill_bound`: ``MEDOMNI_SPILL_IDS``, default 131,072 ids), below which they
are the plain set and list they were, at the same speed; past it they move to a
temporary directory (``TMPDIR``), removed when they are closed:

`MarkSet`
    the ids met: a Python set; past the bound, the set is moved to a temporary LMDB (one
    key per id, committed unsynced: it is scratch) in one sorted write and begun again,
    with a fixed-size filter in front of the LMDB, so that a new id is looked up there
    only when the filter cannot rule it out;
`IdList`
    one level of a walk, iterated in batches in the order a walk reads it (stably sorted
    by first byte, which is LMDB's page order): a list, then runs appended to a file,
    each run cut by first byte so that reading back gives the same order.

Neither changes an answer: the same ids come out in the same order either way (the tests
force a tiny bound and compare). What the kernel maps of a temporary LMDB is given back
past a budget (`medomni_cas.store._mapped.note`), so its pages do not pile up in the RSS;
it is opened with ``writemap``, so a write transaction's pages are the file's (page
cache), not private memory held until it commits.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from itertools import compress, filterfalse, repeat, takewhile
from pathlib import Path
from typing import Any, BinaryIO, cast

import lmdb

from medomni_cas.store import _mapped
from medomni_cas.store._fast import unseen
from medomni_cas.store.ids import ID_SIZE

__all__ = ["DEFAULT_BOUND", "IdList", "MarkSet", "scratch_lmdb", "spill_bound"]

#: Ids held in memory by one set or list before it spills (about 13 MB as a set).
DEFAULT_BOUND = 1 << 17
_ENV = "MEDOMNI_SPILL_IDS"
_FIRST_BYTE = operator.itemgetter(0)
_MAP_SIZE = 1 << 40  # address space only: the file grows as ids are added
_MARK = b"1"  # the value of each id's key (any; not empty, so that a get's answer is truthy)
_FILTER_BITS = 1 << 26  # a spilled set's filter: 8 MiB, about 1 in 200,000 false "maybe"
# at a million ids, 1 in 20 at ten million
_PROBES = 3  # bits per id in the filter: three of the id's own 32-bit words
_SCAN_RATIO = 8  # a cursor's step costs about an eighth of a lookup's descent
_IDS_PER_PAGE = 64  # keys of 32 bytes on a 4 KiB leaf page, about


def spill_bound() -> int:
    """The bound from the environment (``MEDOMNI_SPILL_IDS``), else `DEFAULT_BOUND`."""
    raw = os.environ.get(_ENV, "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_BOUND
    except ValueError:
        raise ValueError(f"{_ENV} must be a whole number of ids, not {raw!r}") from None


def _scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"medomni-{prefix}-"))


def scratch_lmdb(prefix: str) -> tuple[Path, lmdb.Environment]:
    """A fresh temporary LMDB (its folder under TMPDIR, the caller's to remove), opened for
    speed over durability: it lives only as long as the walk or plan that spills to it."""
    folder = _scratch(prefix)
    env = lmdb.open(
        str(folder),
        map_size=_MAP_SIZE,
        subdir=True,
        sync=False,
        metasync=False,
        lock=False,
        readahead=False,
        # the pages a write transaction dirties are the file's own (page cache, given back
        # past a budget with the rest, `_mapped.note`), not a private copy held until commit
        writemap=True,
        meminit=False,
        max_dbs=0,
    )
    _mapped.watch(folder / "data.mdb")
    return folder, env


class _Filter:
    """A Bloom filter of fixed size over ids (BLAKE3 digests: their own bits are the
    probes, no hashing): `maybe` says which of a batch may be in it, and those it says
    are not, are not. Its memory stays `_FILTER_BITS` / 8 bytes however many ids it holds;
    past some ten million ids it says "maybe" more and more often, which costs only
    lookups, never an answer."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._bits = np.zeros(_FILTER_BITS // 8, dtype=np.uint8)

    def _probes(self, ids: list[bytes]) -> Any:
        np = self._np
        words = np.frombuffer(b"".join(ids), dtype="<u4").reshape(len(ids), ID_SIZE // 4)
        return words[:, :_PROBES] & np.uint32(_FILTER_BITS - 1)

    def add(self, ids: list[bytes]) -> None:
        if ids:
            at = self._probes(ids).ravel()
            self._np.bitwise_or.at(self._bits, at >> 3, (1 << (at & 7)).astype(self._np.uint8))

    def maybe(self, ids: list[bytes]) -> list[bool]:
        if not ids:
            return []
        at = self._probes(ids)
        return cast("list[bool]", ((self._bits[at >> 3] >> (at & 7)) & 1).all(axis=1).tolist())


class MarkSet:
    """The ids a walk has met: `unseen` adds a batch and says which were new.

    The newest ids (all of them, up to the bound) are a Python set; past the bound that set
    is moved to the temporary LMDB in one sorted write, and a fixed-size filter over what is
    there says which ids of a batch need a lookup at all: a walk's ids are mostly new, and a
    new id then costs a set insertion, not a B-tree insertion (a spilled walk at about the
    speed of one in memory)."""

    def __init__(self, bound: int | None = None) -> None:
        self.bound = spill_bound() if bound is None else bound
        self._mem: set[bytes] = set()
        self._dir: Path | None = None
        self._env: lmdb.Environment | None = None
        self._filter: _Filter | None = None
        self._old = 0  # ids moved to the temporary LMDB
        self._txn: lmdb.Transaction | None = None  # the read transaction over it

    def __enter__(self) -> MarkSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._env is not None

    def __len__(self) -> int:
        return len(self._mem) + self._old

    def __contains__(self, key: object) -> bool:
        if key in self._mem:
            return True
        if self._env is None or not isinstance(key, bytes) or len(key) != ID_SIZE:
            return False
        return bool(self._older([key]))

    def _older(self, ids: list[bytes]) -> set[bytes]:
        """Those of ``ids`` (32 bytes each) in the temporary LMDB: the filter first, then a
        lookup of those it cannot rule out, in key order."""
        assert self._filter is not None
        ask = sorted(compress(ids, self._filter.maybe(ids)))
        if not ask:
            return set()
        if self._txn is None:
            assert self._env is not None
            self._txn = self._env.begin()
        lo, hi = ask[0], ask[-1]
        # ids are uniform, so about this many of the LMDB's lie between lo and hi: when
        # they are few beside the lookups (a listing's chunk, asked by fsck and gc), one
        # pass of the cursor over them is cheaper than a descent of the tree per id
        between = self._old * (int.from_bytes(hi[:8]) - int.from_bytes(lo[:8])) >> 64
        if between <= _SCAN_RATIO * len(ask):
            cursor = self._txn.cursor()
            if not cursor.set_range(lo):
                return set()
            keys = cast("Iterator[bytes]", cursor.iternext(values=False))  # not buffers
            there = set(takewhile(hi.__ge__, keys))
            _mapped.note(len(there) // _IDS_PER_PAGE + 1)
            return there.intersection(ask)
        got = _mapped.each(self._txn.get, ask)
        return set(compress(ask, map(operator.is_not, got, repeat(None))))

    def unseen(self, ids: Iterable[bytes]) -> list[bytes]:
        """The ``ids`` not met before (each once, in the order of ``ids``), now met."""
        if self._env is None:
            new = list(unseen(self._mem, list(ids)))
        else:
            fresh = list(filterfalse(self._mem.__contains__, dict.fromkeys(ids)))
            if fresh and set(map(len, fresh)) != {ID_SIZE}:
                raise ValueError("a spilled mark set holds 32-byte ids only")
            met = self._older(fresh)
            new = list(filterfalse(met.__contains__, fresh)) if met else fresh
            self._mem.update(new)
        if len(self._mem) > self.bound:
            self._spill()
        return new

    def add(self, ids: Iterable[bytes]) -> None:
        self.unseen(ids)

    def absent(self, keys: list[bytes]) -> list[bytes]:
        """Those of ``keys`` not met, in order (repeats kept)."""
        out = list(filterfalse(self._mem.__contains__, keys))
        if self._env is None or not out:
            return out
        sized = [k for k in dict.fromkeys(out) if len(k) == ID_SIZE]
        met = self._older(sized)
        return list(filterfalse(met.__contains__, out)) if met else out

    def _spill(self) -> None:
        """Move the ids in memory to the temporary LMDB, in one sorted write."""
        keys = sorted(self._mem)
        if set(map(len, keys)) != {ID_SIZE}:
            raise ValueError("a spilled mark set holds 32-byte ids only")
        if self._env is None:
            self._dir, self._env = scratch_lmdb("marks")
            self._filter = _Filter()
        assert self._filter is not None
        if self._txn is not None:
            self._txn.abort()  # a reader sees the tree as it was: opened again after
            self._txn = None
        with self._env.begin(write=True) as txn:
            # the first move is an append (dense pages); later ones are merged into the tree
            txn.cursor().putmulti(zip(keys, repeat(_MARK)), append=not self._old)
        self._filter.add(keys)
        _mapped.note(len(keys))
        self._old += len(keys)
        self._mem = set()

    def close(self) -> None:
        self._mem = set()
        self._filter = None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            self._env.close()
            self._env = None
        if self._dir is not None:
            _mapped.unwatch(self._dir / "data.mdb")
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class IdList:
    """One level of a walk: ids appended, read back in batches, stably sorted by first
    byte (LMDB's page order), the order a walk reads them in."""

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
            self._dir = _scratch("level")
            self._file = open(self._dir / "ids", "w+b")  # noqa: SIM115 (closed by close)
            self._runs = [[] for _ in range(256)]
        self._mem.sort(key=_FIRST_BYTE)  # stable: the order within a byte is kept
        f = self._file
        f.seek(0, os.SEEK_END)
        i, n = 0, len(self._mem)
        while i < n:
            byte = self._mem[i][0]
            j = i
            while j < n and self._mem[j][0] == byte:  # the run of ids of this first byte
                j += 1
            part = self._mem[i:j]
            if set(map(len, part)) != {ID_SIZE}:
                raise ValueError("a spilled level holds 32-byte ids only")
            self._runs[byte].append((f.tell(), j - i))
            f.write(b"".join(part))
            i = j
        self._mem = []

    def batches(self, size: int) -> Iterator[list[bytes]]:
        """Every id in walk order (see the class), ``size`` at a time; may be read again."""
        if self._file is None:
            if not self._sorted:
                self._mem.sort(key=_FIRST_BYTE)
                self._sorted = True
            for i in range(0, len(self._mem), size):
                yield self._mem[i : i + size]
            return
        if self._mem:
            self._flush()
        f = self._file
        out: list[bytes] = []
        for runs in self._runs:
            for offset, count in runs:
                f.seek(offset)
                data = f.read(count * ID_SIZE)
                out += [data[k : k + ID_SIZE] for k in range(0, len(data), ID_SIZE)]
                while len(out) >= size:
                    yield out[:size]
                    out = out[size:]
        if out:
            yield out

    def as_list(self) -> list[bytes] | None:
        """The ids in walk order as the list held, when it is not spilled."""
        if self._file is not None:
            return None
        if not self._sorted:
            self._mem.sort(key=_FIRST_BYTE)
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
