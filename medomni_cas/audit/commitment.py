"""Do a result's (or a comparison's) answer keys open its set's published answer commitment?

A set with a commitment (``studio/commitments/<set>``, `medomni_cas.studio.commitments`)
promised its answers before any run. `check_result_opens` takes the answers of the
result's set build (from the answer keys it links) and, with the salts kept in this store,
makes each (atom, target)'s leaf again: a leaf that is not the committed one, or an (atom,
target) the commitment has no leaf for, is named (pair, arm, patient, atom, target). So a
result scored against answer keys changed after the commitment fails ``audit verify``.

It needs the salts (``studio/answer-salts/<set>``), which only the committing store has;
without them nothing can be opened, which is a notice, not a problem: anyone else checks a
reveal (``medomni audit verify-reveal``) instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from medomni_cas.audit._common import short
from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.records import Result
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio import merkle
from medomni_cas.studio.commitments import (
    AnswerSalts,
    commitment_of,
    entry,
    set_answers,
)
from medomni_cas.studio.records import TaskSetRecord
from medomni_cas.studio.refnames import answer_salts_ref, commitment_ref

__all__ = ["Opened", "check_opens", "commitment_descriptor"]

#: Leaves named one by one before the rest are counted.
_LISTED = 100


@dataclass
class Opened:
    """What `check_opens` found: ``commitment``, the one checked ("" when the set has none,
    or this store has not its salts: then a notice says so)."""

    commitment: str = ""
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    leaves: int = 0  # leaves made again and compared


def check_opens(store: Store, result: ObjectId) -> Opened:
    """Check the result's answers against its set's commitment (see the module docstring)."""
    # a `Result` or a `Comparison`: both link the task set and the set build they scored
    res = store.get(result)
    if not isinstance(res, Result | Comparison):
        raise ValueError(f"{result.hex()} is neither a result nor a comparison")
    set_name = store.get(res.task_set, TaskSetRecord).name
    found = commitment_of(store, set_name)
    out = Opened()
    if found is None:
        return out
    cid, com = found
    sid = store.refs.get(answer_salts_ref(set_name))
    salts = store.get(sid, AnswerSalts) if sid is not None else None
    if salts is None or salts.commitment != cid:
        out.notices.append(
            f"answer commitment {short(cid)} of {set_name}: this store has not its salts, so "
            "the answer keys cannot be opened here (check a reveal with audit verify-reveal)"
        )
        return out
    out.commitment = cid.hex()  # checked from here on
    if merkle.root([s.leaf for s in salts.leaves]).hex() != com.root:
        out.problems.append(
            f"answer commitment {short(cid)} of {set_name}: the salts kept here "
            f"({short(sid)}) do not build its root {com.root[:16]}"
        )
        return out
    committed = {(bytes(s.atom), s.target): s for s in salts.leaves}
    problems: list[str] = []
    for leaf in set_answers(store, res.set_build):
        where = (
            f"pair {leaf.pair}, arm {leaf.arm}, patient {leaf.patient}, atom "
            f"{short(leaf.atom)}, target {leaf.target}"
        )
        s = committed.get((bytes(leaf.atom), leaf.target))
        out.leaves += 1
        if s is None:
            problems.append(
                f"{where}: not in answer commitment {short(cid)} of {set_name} (committed "
                f"to set build {com.set_build[:12]}, the result scored {short(res.set_build)})"
            )
            continue
        made = merkle.leaf_hash(entry(set_name, leaf.atom, leaf.target, leaf.answer, s.salt))
        if made != s.leaf:
            problems.append(
                f"{where}: the answer key's value does not open answer commitment "
                f"{short(cid)} of {set_name}"
            )
    if len(problems) > _LISTED:
        problems = [*problems[:_LISTED], f"... and {len(problems) - _LISTED} more leaves"]
    out.problems += problems
    return out


def commitment_descriptor(store: Store, set_name: str) -> dict[str, Any] | None:
    """The set's commitment as an in-toto resource descriptor, or None without one."""
    found = commitment_of(store, set_name)
    if found is None:
        return None
    cid, com = found
    return {
        "name": commitment_ref(set_name),
        "digest": {"blake3": cid.hex()},
        "annotations": {"root": com.root, "leaves": com.leaves, "scheme": com.scheme},
    }
