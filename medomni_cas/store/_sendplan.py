"""What a transfer will write: each object's depth in the closure and its bytes, on disk
beyond a bound.

A push or pull writes an object only once every object it links is written (children in
an earlier batch than their parents). It plans first (`medomni_cas.store.sync`): a walk
from the roots gives every object it meets a depth, deeper than every object that links
it and that the destination lacks, and keeps the bytes of those it will write; then the
plan is written deepest level first. `SendPlan` is that plan's memory: a record per id
met (its depth, and where its bytes are when they are held).

* Below a bound (a quarter of `spill_bound` ids) the records are a dict, and below
  `HELD_BYTES` the bytes are a dict.
* Beyond them, the newest records are that dict (up to the bound) and older ones sorted
  runs of 48-byte records on disk (`medomni_cas.store._spill.Run`: newest run wins,
  merged two by two as they come), and the bytes a spool file; both read with ``pread``,
  never mapped, files without names (`medomni_cas.store._spill.unnamed`: gone with the
  process, however it ends) in a temporary folder removed when the plan is closed.

A walk meets a whole level's links before it asks what they were (`meet`, then
`settle`), so that a spilled plan answers in one pass over each first byte's records per
level, as the walk's mark set does (`medomni_cas.store._spill.MarkSet`), not a lookup per
link; and `select` reads a level's records the same way. Why not a temporary LMDB (it
was, until stop 26): each write transaction of scattered ids copied every page it
touched and mapped it until it committed, 157 of push's 327 MiB of RSS at 1.44M objects.

Either way the same answers: the tests force a tiny bound and compare.
"""

from __future__ import annotations

import os
import shutil
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, filterfalse, pairwise
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import numpy as np

from medomni_cas.store._spill import (
    IDS,
    IdList,
    Run,
    by_first_byte,
    scratch,
    spill_bound,
    unnamed,
)

__all__ = ["HELD_BYTES", "SendPlan"]

#: Bytes of objects held in memory by a plan before it spills.
HELD_BYTES = 32 << 20
_RECORD = struct.Struct("<32sIQI")  # id, depth, offset of its bytes in the spool, length
_FIELDS = struct.Struct("<IQI")  # a record without its id
_KIND = np.dtype([("id", IDS), ("rest", f"V{_FIELDS.size}")])  # a record, to numpy
_NONE = (1 << 64) - 1  # the offset of an object whose bytes are not held
_MEM = (1 << 64) - 2  # the offset of one whose bytes are held in memory
_PART_ITEMS = 4_096  # objects `select` gives at a time, at most
_PART_BYTES = 16 << 20  # and bytes, about (an object is never cut)
_READ_SPAN = 8 << 20  # bytes of neighbouring objects in the spool read with one pread
#: a gap between two objects to be read that is read with them, not cut into two preads:
#: copying a page costs less than a call, and a level's objects lie a few hundred bytes
#: apart once others moved deeper (at 1.44M objects, 405k of 1.6M gaps were under a page
#: and 412k preads read 1.6M objects, 3.4 us each)
_GAP = 4096
_IOV = 1024  # buffers a pwritev gathers (Linux's IOV_MAX)

_Fields = tuple[int, int, int]  # depth, offset, length
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class SendPlan:
    """Each id met: its depth; for those to be written, their bytes.

    The walk of a level meets its links (`meet`), then settles them (`settle`): which
    were new, which moved deeper. Between the two a level's records change only by
    `hold`, which keeps a depth, so `meet` may drop at once what is known to change
    nothing.
    """

    def __init__(self, bound: int | None = None, held_bytes: int = HELD_BYTES) -> None:
        bound = spill_bound() if bound is None else bound
        self.bound = max(1, bound // 4)
        self.held_bytes = held_bytes
        self._recent: dict[bytes, _Fields] = {}  # every record, or (spilled) the newest
        self._runs: list[Run] = []  # older records, oldest first
        self._held: dict[bytes, bytes] = {}
        self._nbytes = 0
        self._dir: Path | None = None
        self._spool: BinaryIO | None = None  # written and read by its descriptor
        self._end = 0  # the spool's length
        pending = max(1, bound // 8)
        self._plain = IdList(bound=pending)  # met at the depth settled next
        self._deep = IdList(bound=pending)  # the same, and moved there when met higher up
        self._depth: int | None = None  # the depth of what is pending

    def __enter__(self) -> SendPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._dir is not None

    # -- depths ----------------------------------------------------------------------------
    def meet(self, ids: Iterable[bytes], depth: int, *, deepen: bool) -> None:
        """Meet ``ids`` at ``depth``, to be settled with the rest of the level: those not
        met before will be met there; with ``deepen``, those met at a smaller depth will
        be moved there. Every meet before a `settle` is at the same depth."""
        if self._depth is None:
            self._depth = depth
        elif depth != self._depth:
            raise ValueError(f"a meet at depth {depth} among those at {self._depth}")
        recent = self._recent
        if deepen:
            # what is known at this depth or deeper changes nothing
            self._deep.extend(k for k in ids if (f := recent.get(k)) is None or f[0] < depth)
        else:
            self._plain.extend(k for k in ids if k not in recent)

    def settle(self, new: IdList, deeper: IdList) -> None:
        """Put in ``new`` the ids met since the last settle and never before (each once),
        now at their depth; in ``deeper`` those met with ``deepen`` at a smaller depth
        before, now moved to it."""
        depth, self._depth = self._depth, None
        if depth is None:
            return
        plain, deep = self._plain, self._deep
        bound = self._plain.bound
        self._plain, self._deep = IdList(bound=bound), IdList(bound=bound)
        try:
            for byte, keys, deepening in _by_byte(plain, deep):
                unique = list(dict.fromkeys(keys + deepening))
                found = self._find(byte, unique)
                fresh = list(filterfalse(found.__contains__, unique))
                moved = [k for k in dict.fromkeys(deepening) if k in found and found[k][0] < depth]
                # one record shared by every fresh id (a tuple: never changed, replaced)
                self._recent.update(dict.fromkeys(fresh, (depth, _NONE, 0)))
                for k in moved:
                    _, offset, length = found[k]
                    self._recent[k] = (depth, offset, length)
                new.extend(fresh)
                deeper.extend(moved)
                self._bounded()
        finally:
            plain.close()
            deep.close()

    def _find(self, byte: int, keys: list[bytes]) -> dict[bytes, _Fields]:
        """The record of each of ``keys`` (all of first byte ``byte``) met before."""
        recent = self._recent
        out = {k: recent[k] for k in keys if k in recent}
        rest = [k for k in keys if k not in out]
        for run in reversed(self._runs):  # newest first: its record is the current one
            if not rest:
                break
            got = run.found(byte, rest)
            if got:
                out.update(zip(got, map(_FIELDS.unpack, got.values()), strict=True))
                rest = [k for k in rest if k not in got]
        return out

    # -- bytes -----------------------------------------------------------------------------
    def hold(self, items: list[tuple[bytes, bytes]], depth: int) -> None:
        """Keep the bytes of objects met and settled at ``depth`` (to be written)."""
        if self._spool is None:
            for key, data in items:
                if key not in self._held:
                    self._held[key] = data
                    self._nbytes += len(data)
                    self._recent[key] = (depth, _MEM, len(data))
            if self._nbytes > self.held_bytes:
                self._to_spool()
        else:
            unique = sorted(dict(items).items())
            self._spooled(unique, [depth] * len(unique))
        self._bounded()

    def _spooled(self, items: list[tuple[bytes, bytes]], depths: list[int]) -> None:
        """Append the bytes of ``items`` to the spool, and their records (at ``depths``)."""
        if self._spool is None:
            self._spool = unnamed(self._folder())
        start = self._end
        # gathered by the kernel from the objects' own buffers (what is held is not held
        # twice): a file object's writes cut them into 8 KiB, three times the cost
        datas = list(map(_SECOND, items))
        lengths = list(map(len, datas))
        _write_all(self._spool.fileno(), datas, start)
        offsets = accumulate(lengths, initial=start)
        self._recent.update(
            # offsets ends with the end of the last: one more than the others
            zip(map(_FIRST, items), zip(depths, offsets, lengths, strict=False), strict=True)
        )
        self._end = start + sum(lengths)

    def _to_spool(self) -> None:
        """Move the bytes held in memory to the spool, their depths kept."""
        held, self._held, self._nbytes = self._held, {}, 0
        items = sorted(held.items())
        depths: list[int] = []
        for byte, keys in by_first_byte(k for k, _ in items).items():
            found = self._find(byte, keys)
            depths += [found[k][0] for k in keys]
        self._spooled(items, depths)

    def select(self, ids: IdList, depth: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """Those of ``ids`` (all met) whose bytes are held and whose depth is ``depth``,
        with their bytes, in the order of ``ids``, a part at a time (at most
        `_PART_ITEMS` objects and about `_PART_BYTES`)."""
        part: list[tuple[bytes, bytes]] = []
        size = 0
        for byte, keys in ids.by_first_byte():
            found = self._find(byte, keys)
            if len(found) < len(set(keys)):
                gone = next(k for k in keys if k not in found)
                raise KeyError(f"an id the plan has not met: {gone.hex()}")
            picked = [(k, f) for k in keys if (f := found[k])[0] == depth and f[1] != _NONE]
            # cut by the lengths the records give before reading: a byte's objects of a
            # level of large ones are not read at once
            ends = list(accumulate(f[2] for _, f in picked))  # bytes up to each, inclusive
            i = 0
            while i < len(picked):
                before = ends[i - 1] if i else 0
                # up to the first object that fills the part (included: none is cut)
                j = bisect_left(ends, before + _PART_BYTES - size, lo=i) + 1
                j = min(j, i + _PART_ITEMS - len(part), len(picked))
                chunk = picked[i:j]
                part += zip(map(_FIRST, chunk), self._bytes(chunk), strict=True)
                size += ends[j - 1] - before
                i = j
                if len(part) >= _PART_ITEMS or size >= _PART_BYTES:
                    yield part
                    part, size = [], 0
        if part:
            yield part

    def _bytes(self, picked: list[tuple[bytes, _Fields]]) -> list[bytes]:
        """The bytes of each record of ``picked``: neighbours in the spool in one read."""
        out = [b""] * len(picked)
        held = self._held
        at, offsets, lengths = [], [], []  # of those in the spool
        for j, (key, (_, offset, length)) in enumerate(picked):
            if offset == _MEM:
                out[j] = held[key]
            elif length:
                at.append(j)
                offsets.append(offset)
                lengths.append(length)
        if not at:
            return out
        assert self._spool is not None
        fd = self._spool.fileno()
        # in the spool's order; spans of those that lie near each other (a level's, held
        # together, with what went deeper since between them) start where a gap is wider
        # than `_GAP`, and are cut to at most `_READ_SPAN`: one pread each. An object is
        # spooled once, so none overlap.
        where = np.array(offsets, dtype=np.int64)
        order = np.argsort(where, kind="stable")
        starts = where[order]
        ends = starts + np.array(lengths, dtype=np.int64)[order]
        gaps = np.flatnonzero(starts[1:] - ends[:-1] > _GAP) + 1
        bounds = [0, *gaps.tolist(), len(order)]
        js = np.array(at)[order].tolist()
        firsts, lasts = starts.tolist(), ends.tolist()
        for lo, hi in pairwise(bounds):
            while lo < hi:
                first = firsts[lo]
                # up to the last that ends within the span (one at least, however large)
                k = max(bisect_right(lasts, first + _READ_SPAN, lo, hi), lo + 1)
                size = lasts[k - 1] - first
                blob = os.pread(fd, size, first)
                if len(blob) != size:
                    raise OSError(f"the send plan's spool gave {len(blob)} of {size} bytes")
                for j, a, b in zip(js[lo:k], firsts[lo:k], lasts[lo:k], strict=True):
                    out[j] = blob[a - first : b - first]  # the whole blob itself, uncopied
                lo = k
        return out

    # -- spilling --------------------------------------------------------------------------
    def _folder(self) -> Path:
        if self._dir is None:
            self._dir = scratch("plan")
        return self._dir

    def _bounded(self) -> None:
        """Write the newest records as a run past the bound, then merge the last two runs
        while the older is no larger than the newer (a binary counter)."""
        if len(self._recent) <= self.bound:
            return
        recent, self._recent = self._recent, {}
        # packed in one C-level pass (the fields as three columns), sorted by numpy
        packed = b"".join(map(_RECORD.pack, recent, *zip(*recent.values(), strict=True)))
        del recent
        table = np.frombuffer(packed, _KIND)
        records = table[np.argsort(table["id"])].tobytes()
        del packed, table
        self._runs.append(Run.write(self._folder(), records, _RECORD.size))
        while len(self._runs) >= 2 and self._runs[-2].n <= self._runs[-1].n:
            newer, older = self._runs.pop(), self._runs.pop()
            self._runs.append(Run.merged(self._folder(), older, newer))

    def close(self) -> None:
        self._recent, self._held = {}, {}
        self._plain.close()
        self._deep.close()
        for run in self._runs:
            run.close()
        self._runs = []
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _by_byte(a: IdList, b: IdList) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """Each first byte met in ``a`` or ``b`` and its ids in each, in byte order."""
    ia, ib = a.by_first_byte(), b.by_first_byte()
    na, nb = next(ia, None), next(ib, None)
    while na is not None or nb is not None:
        byte = min(n[0] for n in (na, nb) if n is not None)
        here_a = na[1] if na is not None and na[0] == byte else []
        here_b = nb[1] if nb is not None and nb[0] == byte else []
        if here_a:
            na = next(ia, None)
        if here_b:
            nb = next(ib, None)
        yield byte, here_a, here_b


def _write_all(fd: int, datas: list[bytes], offset: int) -> None:
    """Write ``datas`` end to end at ``offset`` of ``fd``, `_IOV` buffers a call."""
    for i in range(0, len(datas), _IOV):
        chunk = datas[i : i + _IOV]
        size = sum(map(len, chunk))
        done = os.pwritev(fd, chunk, offset)
        if done < size:  # cut short (a signal, a disk nearly full): the rest as one buffer
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                n = os.pwrite(fd, rest, offset + done)
                if not n:
                    raise OSError(f"the send plan's spool took 0 of {len(rest)} bytes")
                rest, done = rest[n:], done + n
        offset += size
