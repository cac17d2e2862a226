"""Checking what a result was scored against: its `AnswerColumns` made again.

The scorer derives each arm's answer columns from the answer keys once and finds them again
by a ref, so a later score trusts what it finds there. An audit does not: it makes them again
from the answer keys the result links (in a scratch store, writing nothing) and names each
one whose id differs, with what differs.
"""

from __future__ import annotations

from medomni_cas.bench.columns import Truths, arm_rows, make_answer_columns
from medomni_cas.bench.records import AnswerColumns, Result
from medomni_cas.store import encoding
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.store import Store

__all__ = ["check_answer_column_ids", "check_answer_columns"]


def check_answer_columns(store: Store, result: ObjectId) -> list[str]:
    """One line per answer columns of ``result`` that are not what its answer keys give."""
    return check_answer_column_ids(store, store.get(result, Result).answer_columns)


def check_answer_column_ids(store: Store, ids: tuple[ObjectId, ...]) -> list[str]:
    """One line per answer columns of ``ids`` (a result's, a comparison's) that are not
    what their answer keys give."""
    scratch = Store(MemoryBackend())
    truths: Truths = {}
    problems = []
    for aid in ids:
        kept = store.get(aid, AnswerColumns)
        key = arm_rows(store, kept.set_build, kept.arm, kept.arm_variant)
        made = make_answer_columns(store, key, truths, sink=scratch)
        if hash_bytes(encoding.encode(made)) == aid:
            continue
        what = [f for f in AnswerColumns.__struct_fields__ if getattr(made, f) != getattr(kept, f)]
        columns = sorted(
            c
            for c in set(made.columns) | set(kept.columns)
            if made.columns.get(c) != kept.columns.get(c)
        )
        detail = ", ".join(what) + (f" (columns {', '.join(columns)})" if columns else "")
        problems.append(
            f"answer columns {aid} of arm {key.label} are not what the answer keys give: "
            f"{detail} differ"
        )
    return problems
