"""The store's fast paths: links, canonical checks and closure checks a batch at a time.

Private to `medomni_cas.store`, and this module is its seam: the rest of the store imports
from here, nothing outside the store imports it (walks and checks go through
`medomni_cas.store.verify.walk_checked`, `Store.walk` and sync). Every answer is the one the
definitions give (`encoding.links`, `encoding.validate_canonical`); the tests compare the two
on odd bytes, and ``MEDOMNI_EXACT_CHECKS=1`` sends everything through the definitions
(`exact`).

Modules
    links   how one kind's objects are read: views, mirrors, generated readers, `fast_links`
    groups  a batch at a time: grouping by header, `BatchReader` (which owns the hint)
    check   one batch of a closure check: `BatchChecker`, `Findings`, `mismatches`
    pool    `CheckPool`: a check's batches, shared with helper processes on big levels
    seen    `unseen`, `new_links`: what a walk has not met yet
    exact   the switch, and the route by the definitions
"""

from medomni_cas.store._fast.check import BatchChecker, Findings, mismatches
from medomni_cas.store._fast.exact import exact_checks
from medomni_cas.store._fast.groups import BatchReader
from medomni_cas.store._fast.links import LINK_MARK, fast_links
from medomni_cas.store._fast.pool import BATCH, MIN_LEVEL, CheckPool, Listed, default_jobs
from medomni_cas.store._fast.seen import new_links, unseen

__all__ = [
    "BATCH",
    "LINK_MARK",
    "MIN_LEVEL",
    "BatchChecker",
    "BatchReader",
    "CheckPool",
    "Findings",
    "Listed",
    "default_jobs",
    "exact_checks",
    "fast_links",
    "mismatches",
    "new_links",
    "unseen",
]
