"""A build's evidence column: each atom's evidence tree id, kept for the comparer's pairing.

A contrast pairs two arms' rows of a patient only when their atoms hold the same evidence
tree, so a compare needs every atom's evidence id. Reading them means decoding every atom of
every build (500,000 of them for a 10M-row set: the first compare's largest cost), so the
column is kept under ``scores/evidence/<build>``: a blob of the 32-byte ids, in the build's
atom order. The harness writes it when it plans a job, from atoms it has just verified and
decoded anyway; the comparer writes it when it is missing. It is a cache: ``audit verify``
re-derives every comparison from the atoms themselves, so a forged column is found there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from medomni_cas.bench.refnames import EVIDENCE_REFS, evidence_ref
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.records import AtomTask

__all__ = ["evidence_column", "keep_column", "keep_evidence"]


def evidence_column(atoms: Sequence[AtomTask]) -> bytes:
    """The column's bytes: each atom's evidence tree id, in order."""
    return b"".join(bytes(a.evidence) for a in atoms)


def keep_column(store: Store, build: ObjectId, data: bytes) -> None:
    """Keep ``data`` as ``build``'s evidence column (writes nothing if it is kept already)."""
    blob = store.put_blob(data)
    ref = evidence_ref(build)
    if store.refs.get(ref) != blob:
        # harnesses of one set may plan together: every one of them writes the same blob
        store.refs.update(ref, lambda _old: blob, message="evidence")


def keep_evidence(store: Store, builds: Mapping[ObjectId, Sequence[AtomTask]]) -> int:
    """Keep the evidence column of each of ``builds`` (build result -> its atoms, in order)
    that has none yet, with one read of the refs; how many were written."""
    ids = list(builds)
    kept = store.refs.get_many_by_id(EVIDENCE_REFS, ids)
    missing = [b for b, k in zip(ids, kept, strict=True) if k is None]
    for build in missing:
        keep_column(store, build, evidence_column(builds[build]))
    return len(missing)
