"""Answer commitments: a root published before any run that the answers open later.

A benchmark owner commits to a set build's answers without showing them: each answer of
each (atom, target) is one leaf of a Merkle tree, salted with 32 fresh random bytes (an
unsalted hash of a five-class label is guessed in five tries), and the small
`AnswerCommitment` (the root, the leaf count, the scheme, the set) can be published, in a
configs-only bundle or on its own, and attested. The salts stay with the answer keys in
the owner's store (`AnswerSalts`, under ``studio/answer-salts/<set>``): never in an atom's
closure, never in a configs-only bundle, never linked from the commitment. Opening some
leaves later (`medomni_cas.studio.reveal`) shows those answers and salts with inclusion
proofs; ``medomni audit verify`` checks that a result's answer keys open the set's
commitment (`medomni_cas.audit.commitment`).

Scheme ``medomni-answers/v1`` (the `SCHEME` string, stored in every commitment)
    Leaves are RFC 6962 leaves over SHA-256 (`medomni_cas.studio.merkle`), one per (atom,
    target) of every entry of the set build, sorted by the atom id's 32 bytes and then by
    the target's UTF-8 bytes. A leaf's entry is::

        "medomni.answer-leaf.v1" 0x00
        u64be(len(set)) set            the set's name, <benchmark>/<set>, UTF-8
        atom                           the atom task's id, 32 bytes
        u64be(len(target)) target      UTF-8
        u64be(len(answer)) answer      the canonical answer (below)
        salt                           32 bytes

    and the canonical answer is ``n`` for none, ``s`` + UTF-8 for a label or text, and ``f``
    + the IEEE 754 binary64 big-endian for a number (integers and floats alike; NaN, the
    infinities and -0.0 are refused, as the store refuses them).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from medomni_cas.errors import MedomniError
from medomni_cas.store.encoding import Part, Record
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio import merkle
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildResult, SetBuild
from medomni_cas.studio.refnames import answer_salts_ref, commitment_ref

__all__ = [
    "DOMAIN",
    "SALT_SIZE",
    "SCHEME",
    "AnswerCommitment",
    "AnswerSalts",
    "CommitError",
    "Committed",
    "Leaf",
    "SaltedLeaf",
    "canonical_answer",
    "commit",
    "commitment_of",
    "entry",
    "make_commitment",
    "set_answers",
]

SCHEME = "medomni-answers/v1: rfc6962 sha256, leaves sorted by (atom, target)"
DOMAIN = b"medomni.answer-leaf.v1\x00"
SALT_SIZE = 32


class CommitError(MedomniError, ValueError):
    """A set that cannot be committed or opened (no build, no commitment, a bad answer)."""


class AnswerCommitment(Record, frozen=True, kw_only=True):
    """The root of a set build's salted answer leaves: publishable, it holds no answer and
    no salt. It links only the task set (which links nothing); the set build is named as
    text, since a link would put the answers in the commitment's closure."""

    __kind__ = "medomni.answer-commitment"

    set: str  # <benchmark>/<set>
    task_set: ObjectId
    set_build: str  # hex of the `SetBuild` committed to
    scheme: str
    root: str  # hex of the Merkle root
    leaves: int


class SaltedLeaf(Part, frozen=True, kw_only=True):
    atom: ObjectId
    target: str
    salt: bytes  # 32 random bytes
    leaf: bytes  # the leaf hash, SHA-256(0x00 || entry)


class AnswerSalts(Record, frozen=True, kw_only=True):
    """The secret half: each leaf's salt, kept with the answer keys (never published). The
    leaf hashes are kept too, so that an answer that no longer opens its leaf is named."""

    __kind__ = "medomni.answer-salts"

    commitment: ObjectId
    set_build: ObjectId
    leaves: tuple[SaltedLeaf, ...]  # in leaf order


@dataclass(frozen=True)
class Leaf:
    """One (atom, target) of a set build with its answer, in leaf order."""

    atom: ObjectId
    target: str
    answer: str | float | None
    pair: str
    arm: str  # the arm label
    patient: str


def canonical_answer(value: object) -> bytes:
    """The answer's bytes in a leaf (see the module docstring)."""
    if value is None:
        return b"n"
    if isinstance(value, str):
        return b"s" + value.encode("utf-8")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CommitError(f"an answer is text, a number or none, not {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or (v == 0.0 and math.copysign(1.0, v) < 0):
        raise CommitError(f"answer {value!r} has no canonical form")
    return b"f" + struct.pack(">d", v)


def _lp(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def entry(set_name: str, atom: bytes, target: str, answer: object, salt: bytes) -> bytes:
    """A leaf's entry: what its hash is over (see the module docstring)."""
    if len(atom) != 32 or len(salt) != SALT_SIZE:
        raise CommitError("an atom id and a salt are 32 bytes each")
    return (
        DOMAIN
        + _lp(set_name.encode("utf-8"))
        + bytes(atom)
        + _lp(target.encode("utf-8"))
        + _lp(canonical_answer(answer))
        + bytes(salt)
    )


def set_answers(store: Store, set_build: ObjectId) -> list[Leaf]:
    """Every (atom, target) of the set build with its answer, in leaf order."""
    sb = store.get(set_build, SetBuild)
    out: dict[tuple[bytes, str], Leaf] = {}
    for e in sb.entries:
        br = store.get(e.result, BuildResult)
        key = store.get(br.answer_key, AnswerKey)
        atoms = dict(store.get_many(br.atoms, AtomTask))
        label = arm_label(e.arm, e.arm_variant)
        for aid in br.atoms:
            patient = atoms[aid].patient
            values = key.values.get(patient, {})
            for target in key.targets:
                out[(bytes(aid), target)] = Leaf(
                    aid, target, values.get(target), e.pair, label, patient
                )
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1].encode("utf-8")))]


def make_commitment(
    set_name: str,
    task_set: ObjectId,
    set_build: ObjectId,
    leaves: Iterable[Leaf],
    salts: Mapping[tuple[bytes, str], bytes] | None = None,
) -> tuple[AnswerCommitment, list[SaltedLeaf]]:
    """The commitment to ``leaves`` (in leaf order) and its salted leaves; ``salts`` by
    (atom, target) are used where given, fresh random ones elsewhere."""
    salted = []
    for leaf in leaves:
        salt = (salts or {}).get((bytes(leaf.atom), leaf.target)) or os.urandom(SALT_SIZE)
        h = merkle.leaf_hash(entry(set_name, leaf.atom, leaf.target, leaf.answer, salt))
        salted.append(SaltedLeaf(atom=leaf.atom, target=leaf.target, salt=salt, leaf=h))
    root = merkle.root([s.leaf for s in salted])
    rec = AnswerCommitment(
        set=set_name,
        task_set=task_set,
        set_build=set_build.hex(),
        scheme=SCHEME,
        root=root.hex(),
        leaves=len(salted),
    )
    return rec, salted


@dataclass(frozen=True)
class Committed:
    """What `commit` did: the commitment (new, or the one already made for this build)."""

    set: str
    commitment: ObjectId
    record: AnswerCommitment
    new: bool
    ref: str


def commitment_of(store: Store, set_name: str) -> tuple[ObjectId, AnswerCommitment] | None:
    """The set's published commitment (``studio/commitments/<set>``), if it has one."""
    cid = store.refs.get(commitment_ref(set_name))
    if cid is None:
        return None
    return cid, store.get(cid, AnswerCommitment)


def commit(store: Store, set_name: str) -> Committed:
    """Commit to the answers of the set's latest build: store the `AnswerCommitment`
    (``studio/commitments/<set>``) and, apart, its salts (``studio/answer-salts/<set>``).

    A build already committed to keeps its commitment (committing again changes nothing:
    new salts would give a new root, and the published one would no longer open); a later
    build of the set (an X rise) gets a new commitment."""
    from medomni_cas.studio.tasksets import show_set

    view = show_set(store, set_name)
    if view.build is None:
        raise CommitError(
            f"task set {set_name} has no build to commit to; run `medomni studio taskset build`"
        )
    have = commitment_of(store, set_name)
    if have is not None and have[1].set_build == view.build.hex():
        return Committed(set_name, have[0], have[1], False, commitment_ref(set_name))
    rec, salted = make_commitment(
        set_name, view.task_set, view.build, set_answers(store, view.build)
    )
    cid = store.put(rec)
    sid = store.put(AnswerSalts(commitment=cid, set_build=view.build, leaves=tuple(salted)))
    # the salts first: a commitment is never published here without what opens it
    store.refs.update(answer_salts_ref(set_name), lambda _old: sid, message=f"commit {set_name}")
    store.refs.update(commitment_ref(set_name), lambda _old: cid, message=f"commit {set_name}")
    return Committed(set_name, cid, rec, True, commitment_ref(set_name))
