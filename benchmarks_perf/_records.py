"""Record kinds of the benchmarks' own, in a module of their own: a check's helper
processes import the modules that define the kinds they meet, and this one is light."""

from __future__ import annotations

from medomni_cas.store.encoding import Record


class BenchAtom(Record, kw_only=True):
    """A stand-in for an atom task: the runs link it, the audit walks to it."""

    __kind__ = "bench.atom"

    pair: str
    arm: str
    index: int
