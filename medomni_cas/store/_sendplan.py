"""What a transfer will write: each object's depth in the closure and its bytes, on disk
beyond a bound.

A push or pull writes an object only once every object it links is written (children in
an earlier batch than their parents). It plans first (`medomni_cas.store.sync`): a walk
from the roots gives every object it meets a depth, deeper than every object that links
it and that the destination lacks, and keeps the bytes of those it will write; then the
plan is written deepest level first. `SendPlan` is that plan's memory:

* below a bound (a quarter of `spill_bound` ids, or `HELD_BYTES` of bytes) a dict of
  depths and a dict of bytes;
* beyond it, a temporary LMDB (one key per id, its depth and where its bytes are) and a
  spool file of the bytes (read back with ``pread``: never mapped), in a temporary
  directory removed when the plan is closed.

Either way the same answers: the tests force a tiny bound and compare.
"""

from __future__ import annotations

import operator
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from itertools import compress, filterfalse, repeat
from pathlib import Path
from typing import BinaryIO, cast

import lmdb

from medomni_cas.store import _mapped
from medomni_cas.store._spill import scratch_lmdb, spill_bound

__all__ = ["HELD_BYTES", "SendPlan"]

#: Bytes of objects held in memory by a plan before it spills.
HELD_BYTES = 32 << 20
_VALUE = struct.Struct("<IQI")  # depth, offset of the bytes in the spool, their length
_DEPTH = struct.Struct("<I")  # the depth alone: the value's first field
_NONE = (1 << 64) - 1  # the offset of an object whose bytes are not held
_COMMIT_EVERY = 1 << 14  # ids changed per write transaction (its dirty list is bounded)


def _fields(values: list[bytes | None]) -> list[tuple[int, int, int]]:
    """The (depth, offset, length) of each value read, in one C-level pass."""
    if None in values:
        raise KeyError("an id the plan has not met")
    return list(_VALUE.iter_unpack(b"".join(cast("list[bytes]", values))))


class SendPlan:
    """Each id met: its depth; for those to be written, their bytes."""

    def __init__(self, bound: int | None = None, held_bytes: int = HELD_BYTES) -> None:
        self.bound = max(1, (spill_bound() if bound is None else bound) // 4)
        self.held_bytes = held_bytes
        self._depth: dict[bytes, int] | None = {}
        self._held: dict[bytes, bytes] = {}
        self._nbytes = 0
        self._dir: Path | None = None
        self._env: lmdb.Environment | None = None
        self._spool: BinaryIO | None = None
        self._end = 0  # the spool's length

    def __enter__(self) -> SendPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spilled(self) -> bool:
        return self._env is not None

    # -- depths ----------------------------------------------------------------------------
    def meet(
        self, ids: Iterable[bytes], depth: int, *, deepen: bool
    ) -> tuple[list[bytes], list[bytes]]:
        """Of ``ids`` (each once): those not met before, now met at ``depth``; and, with
        ``deepen``, those met before at a smaller depth, now moved to ``depth``."""
        fresh = list(dict.fromkeys(ids))
        if self._depth is not None:
            known = self._depth
            new = list(filterfalse(known.__contains__, fresh))
            known.update(dict.fromkeys(new, depth))
            deeper: list[bytes] = []
            if deepen:
                deeper = [k for k in fresh if known[k] < depth]
                known.update(dict.fromkeys(deeper, depth))
            if len(known) > self.bound:
                self._spill()
            return new, deeper
        fresh.sort()  # in key order: neighbouring pages of the tree
        new, deeper = [], []
        for i in range(0, len(fresh), _COMMIT_EVERY):
            part = fresh[i : i + _COMMIT_EVERY]
            with self._writing() as txn:
                # C-level passes, not a Python call per id: what is there, then one
                # sorted write of the new ids and one of the deepened ones
                values = _mapped.each(txn.get, part)
                fresh_here = list(compress(part, map(operator.is_, values, repeat(None))))
                txn.cursor().putmulti(zip(fresh_here, repeat(_VALUE.pack(depth, _NONE, 0))))
                new += fresh_here
                if deepen:
                    was = [(k, v) for k, v in zip(part, values, strict=True) if v is not None]
                    moved = [(k, v) for k, v in was if _DEPTH.unpack_from(v)[0] < depth]
                    if moved:
                        txn.cursor().putmulti(
                            (k, _DEPTH.pack(depth) + v[_DEPTH.size :]) for k, v in moved
                        )
                        deeper += [k for k, _ in moved]
        return new, deeper

    def lookup(self, ids: list[bytes]) -> list[tuple[int, bool]]:
        """For each of ``ids`` (all met): its depth, and whether its bytes are held."""
        if self._depth is not None:
            held = self._held
            return [(self._depth[k], k in held) for k in ids]
        assert self._env is not None
        with self._env.begin() as txn:
            fields = _fields(_mapped.each(txn.get, ids))
        return [(depth, offset != _NONE) for depth, offset, _ in fields]

    # -- bytes -----------------------------------------------------------------------------
    def hold(self, items: list[tuple[bytes, bytes]]) -> None:
        """Keep the bytes of objects met (to be written); their depths stay."""
        if self._depth is not None:
            for key, data in items:
                if key not in self._held:
                    self._held[key] = data
                    self._nbytes += len(data)
            if self._nbytes > self.held_bytes:
                self._spill()
            return
        assert self._spool is not None
        items = sorted(dict(items).items())
        blob = b"".join(data for _, data in items)
        start = self._end
        self._spool.seek(start)
        self._spool.write(blob)
        self._end += len(blob)
        pack = _VALUE.pack
        for i in range(0, len(items), _COMMIT_EVERY):
            part = items[i : i + _COMMIT_EVERY]
            with self._writing() as txn:
                get = cast("Callable[[bytes], bytes | None]", txn.get)  # one overload of it
                fields = _fields(_mapped.each(get, [key for key, _ in part]))
                placed = []
                for (key, data), (depth, offset, _) in zip(part, fields, strict=True):
                    if offset == _NONE:
                        placed.append((key, pack(depth, start, len(data))))
                    start += len(data)
                txn.cursor().putmulti(placed)

    def held(self, ids: list[bytes]) -> list[bytes]:
        """The bytes of ``ids`` (all held), in order."""
        if self._depth is not None:
            return list(map(self._held.__getitem__, ids))
        assert self._env is not None and self._spool is not None
        with self._env.begin() as txn:
            places = [(offset, length) for _, offset, length in _fields(_mapped.each(txn.get, ids))]
        self._spool.flush()
        fd = self._spool.fileno()
        out: list[bytes] = [b""] * len(ids)
        # read in the spool's order: the bytes of a level were written together
        for j in sorted(range(len(ids)), key=places.__getitem__):
            offset, length = places[j]
            out[j] = os.pread(fd, length, offset) if length else b""
        return out

    # -- spilling --------------------------------------------------------------------------
    def _writing(self) -> lmdb.Transaction:
        assert self._env is not None
        return self._env.begin(write=True)

    def _spill(self) -> None:
        assert self._depth is not None
        self._dir, self._env = scratch_lmdb("plan")
        self._spool = open(self._dir / "spool", "w+b")  # noqa: SIM115 (closed by close)
        depths, held = self._depth, self._held
        self._depth, self._held, self._nbytes = None, {}, 0
        keys = sorted(depths)
        pack = _VALUE.pack
        start = 0
        chunks: list[bytes] = []
        for i in range(0, len(keys), _COMMIT_EVERY):
            with self._writing() as txn:
                cur = txn.cursor()
                pairs = []
                for key in keys[i : i + _COMMIT_EVERY]:
                    data = held.get(key)
                    if data is None:
                        pairs.append((key, pack(depths[key], _NONE, 0)))
                    else:
                        pairs.append((key, pack(depths[key], start, len(data))))
                        chunks.append(data)
                        start += len(data)
                cur.putmulti(pairs, append=True)
            self._spool.write(b"".join(chunks))
            chunks = []
        self._end = start

    def close(self) -> None:
        self._depth, self._held = {}, {}
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        if self._env is not None:
            self._env.close()
            self._env = None
        if self._dir is not None:
            _mapped.unwatch(self._dir / "data.mdb")
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
