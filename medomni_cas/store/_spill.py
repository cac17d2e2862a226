"""Sets and lists of ids that spill to disk beyond a bound, so a walk's memory stays flat.

A walk over a store of 100M objects would otherwise hold every id it met (about 100 B
each in a Python set) and whole levels of the DAG as lists. Here both stay in memory up
to a bound (`spill_bound`: ``MEDOMNI_SPILL_IDS``, default 131,072 ids), below which they
are the plain set and list they were, at the same speed; past it they move to a
temporary directory (``TMPDIR``), removed when they are closed:

`MarkSet`
    the ids met: a Python set, then a temporary LMDB (one key per id; a batch of ids is
    asked and added in one write transaction, committed unsynced: it is scratch);
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
from itertools import compress, filterfalse, repeat
from pathlib import Path
from typing import BinaryIO

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
_COMMIT_EVERY = 1 << 14  # ids added per write transaction of a spilled set (its dirty
# list is bounded; with writemap its pages are the file's, in the page cache)


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


class MarkSet:
    """The ids a walk has met: `unseen` adds a batch and says which were new."""

    def __init__(self, bound: int | None = None) -> None:
        self.bound = spill_bound() if bound is None else bound
        self._mem: set[bytes] | None = set()
        self._dir: Path | None = None
        self._env: lmdb.Environment | None = None
        self._n = 0
        self._txn: lmdb.Transaction | None = None
        self._pending = 0  # ids added in the open write transaction

    def __enter__(self) -> MarkSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._env is not None

    def __len__(self) -> int:
        return len(self._mem) if self._mem is not None else self._n

    def __contains__(self, key: object) -> bool:
        if self._mem is not None:
            return key in self._mem
        assert self._env is not None
        if not isinstance(key, bytes) or not key:
            return False
        return self._writing().get(key) is not None

    def unseen(self, ids: Iterable[bytes]) -> list[bytes]:
        """The ``ids`` not met before (each once, in the order of ``ids``), now met."""
        if self._mem is not None:
            new = list(unseen(self._mem, list(ids)))
            if len(self._mem) > self.bound:
                self._spill()
            return new
        assert self._env is not None
        fresh = list(dict.fromkeys(ids))
        # two C-level passes, not a Python call per id: which are there, then the new
        # ones added in key order (an append-like walk of the tree's pages)
        txn = self._writing()
        got = _mapped.each(txn.get, fresh)
        new = list(compress(fresh, map(operator.is_, got, repeat(None))))
        if new:
            txn.cursor().putmulti(zip(sorted(new), repeat(_MARK)), dupdata=False)
            self._pending += len(new)
            if self._pending >= _COMMIT_EVERY:
                self._commit()
        self._n += len(new)
        self._dropped(len(new))
        return new

    def add(self, ids: Iterable[bytes]) -> None:
        self.unseen(ids)

    def absent(self, keys: list[bytes]) -> list[bytes]:
        """Those of ``keys`` not met, in order (repeats kept)."""
        if self._mem is not None:
            return list(filterfalse(self._mem.__contains__, keys))
        assert self._env is not None
        got = _mapped.each(self._writing().get, keys)
        return list(compress(keys, map(operator.is_, got, repeat(None))))

    def _spill(self) -> None:
        assert self._mem is not None
        self._dir, self._env = scratch_lmdb("marks")
        keys = sorted(self._mem)  # appended in key order: dense pages, fast
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(keys, repeat(_MARK)), append=True)
        self._n = len(keys)
        self._mem = None

    def _writing(self) -> lmdb.Transaction:
        """The open write transaction (reads see its writes): one per `_COMMIT_EVERY` ids
        added, not one per batch (a commit writes every page the batch touched)."""
        if self._txn is None:
            assert self._env is not None
            self._txn = self._env.begin(write=True)
        return self._txn

    def _commit(self) -> None:
        if self._txn is not None:
            self._txn.commit()
            self._txn = None
        self._pending = 0

    def _dropped(self, n: int) -> None:
        _mapped.note(n)

    def close(self) -> None:
        self._mem = set()
        if self._txn is not None:
            self._txn.abort()  # scratch: nothing to keep
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
