"""Open an answer commitment: answers and salts with inclusion proofs, checked by anyone.

`reveal` writes the openings of some (or all) atoms of a committed set as one JSON file::

    {"format": "medomni-answer-reveal/v1", "set": "<benchmark>/<set>",
     "commitment": "<AnswerCommitment id>", "scheme": "...", "root": "<hex>", "leaves": N,
     "openings": [{"index": i, "atom": "<hex>", "target": "...", "pair": "...",
                   "arm": "...", "answer": <label | number | null>, "salt": "<hex>",
                   "leaf": "<hex>", "proof": ["<hex>", ...]}, ...]}

A set reading a credentialed dataset (or one the studio does not show) is never revealed
unless asked for exactly that (``allow_credentialed``): its answers are patient data.

`verify_reveal` checks a file against the *published* commitment (the object, found by
id in a store, never the file's word for it), naming the part that fails:

* ``root`` / ``leaves`` / ``set`` / ``scheme``: the file's copy differs from the
  published commitment;
* per opening, ``leaf``: its answer and salt, through its proof, open the root, but the
  leaf hash the file states is another; ``answer/salt``: the stated leaf opens the root,
  but the answer and salt do not hash to it (one of them was changed); ``proof``: no path
  from the leaf to the root (a proof step, the index, or everything was changed);
  ``salt``, ``atom``, ``answer``, ``index``: a field that is not well formed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio import merkle
from medomni_cas.studio.commitments import (
    SALT_SIZE,
    AnswerCommitment,
    AnswerSalts,
    CommitError,
    commitment_of,
    entry,
    set_answers,
)
from medomni_cas.studio.refnames import answer_salts_ref

__all__ = ["FORMAT", "RevealProblem", "RevealReport", "reveal", "verify_reveal"]

FORMAT = "medomni-answer-reveal/v1"


def reveal(
    store: Store,
    set_name: str,
    *,
    atoms: Sequence[str] | None = None,
    studio: str | os.PathLike[str] | None = None,
    allow_credentialed: bool = False,
) -> dict[str, Any]:
    """The openings of the set's commitment: every leaf of ``atoms`` (ids or unique
    prefixes of 8+ hex characters; None: every atom) with its answer, salt and proof."""
    from medomni_cas.studio.tasksets import _credentialed, show_set

    found = commitment_of(store, set_name)
    if found is None:
        raise CommitError(
            f"task set {set_name} has no answer commitment in {store.url}; make one with "
            f"`medomni studio taskset commit {set_name}`"
        )
    cid, com = found
    sid = store.refs.get(answer_salts_ref(set_name))
    salts = store.get(sid, AnswerSalts) if sid is not None else None
    if salts is None or salts.commitment != cid:
        raise CommitError(
            f"{store.url} has no salts of commitment {cid.hex()} of {set_name}: only the store "
            "that committed can open it"
        )
    if not allow_credentialed:
        view = show_set(store, set_name)
        cred = _credentialed(store, Path(studio) if studio else None, view.entries)
        if cred:
            raise CommitError(
                f"task set {set_name} reads credentialed data ({', '.join(cred)}): its answers "
                "are revealed only when asked for exactly that (--reveal-credentialed)"
            )
    leaves = set_answers(store, salts.set_build)
    if [(bytes(x.atom), x.target) for x in leaves] != [
        (bytes(s.atom), s.target) for s in salts.leaves
    ]:
        raise CommitError(f"the salts of {set_name} are not of its set build's atoms")
    chosen = _chosen(leaves, atoms)
    tree = merkle.levels([s.leaf for s in salts.leaves])
    openings = []
    for i in chosen:
        leaf, salted = leaves[i], salts.leaves[i]
        openings.append(
            {
                "index": i,
                "atom": leaf.atom.hex(),
                "target": leaf.target,
                "pair": leaf.pair,
                "arm": leaf.arm,
                "answer": leaf.answer,
                "salt": salted.salt.hex(),
                "leaf": salted.leaf.hex(),
                "proof": [p.hex() for p in merkle.inclusion_proof(tree, i)],
            }
        )
    return {
        "format": FORMAT,
        "set": set_name,
        "commitment": cid.hex(),
        "scheme": com.scheme,
        "root": com.root,
        "leaves": com.leaves,
        "openings": openings,
    }


def _chosen(leaves: Sequence[Any], atoms: Sequence[str] | None) -> list[int]:
    if atoms is None:
        return list(range(len(leaves)))
    out: list[int] = []
    for spec in atoms:
        p = spec.strip().lower()
        if len(p) < 8:
            raise CommitError(f"atom {spec!r}: give at least 8 hex characters of its id")
        hits = sorted({leaf.atom.hex() for leaf in leaves if leaf.atom.hex().startswith(p)})
        if not hits:
            raise CommitError(f"atom {spec!r} is not an atom of the committed set build")
        if len(hits) > 1:
            raise CommitError(f"atom {spec!r} is ambiguous: {', '.join(h[:16] for h in hits)}")
        out += [i for i, leaf in enumerate(leaves) if leaf.atom.hex() == hits[0]]
    return sorted(set(out))


class RevealProblem(msgspec.Struct, kw_only=True):
    """One part of a reveal that fails: ``part`` names it; ``opening`` is its index in the
    file's ``openings`` (-1: the file as a whole)."""

    part: str
    message: str
    opening: int = -1
    atom: str = ""
    target: str = ""


class RevealReport(msgspec.Struct, kw_only=True):
    """What `verify_reveal` found; ``ok`` when ``problems`` is empty."""

    ok: bool
    set: str
    commitment: str
    root: str
    opened: int  # openings that open the published root
    openings: int
    problems: list[RevealProblem] = []


def _hex(value: object, size: int) -> bytes | None:
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def verify_reveal(doc: Any, commitment: AnswerCommitment, commitment_id: ObjectId) -> RevealReport:
    """Check the reveal ``doc`` (the file's JSON) against the published ``commitment``."""
    report = RevealReport(
        ok=False,
        set=commitment.set,
        commitment=commitment_id.hex(),
        root=commitment.root,
        opened=0,
        openings=0,
    )
    problems = report.problems

    def whole(part: str, message: str) -> None:
        problems.append(RevealProblem(part=part, message=f"{part}: {message}"))

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        whole("format", f"not a {FORMAT} file")
        return report
    for name, mine in (
        ("commitment", commitment_id.hex()),
        ("set", commitment.set),
        ("scheme", commitment.scheme),
        ("root", commitment.root),
        ("leaves", commitment.leaves),
    ):
        if doc.get(name) != mine:
            whole(name, f"the file says {doc.get(name)!r}, the published commitment {mine!r}")
    root = bytes.fromhex(commitment.root)
    openings = doc.get("openings")
    if not isinstance(openings, list):
        whole("openings", "not a list")
        return report
    report.openings = len(openings)
    seen: set[int] = set()
    for n, op in enumerate(openings):
        problem = _check_opening(op, n, commitment, root, seen)
        if problem is None:
            report.opened += 1
        else:
            problems.append(problem)
    report.ok = not problems
    return report


def _check_opening(
    op: Any, n: int, com: AnswerCommitment, root: bytes, seen: set[int]
) -> RevealProblem | None:
    if not isinstance(op, dict):
        return RevealProblem(part="opening", message=f"openings[{n}]: not an object", opening=n)
    atom_text, target = str(op.get("atom", "")), op.get("target")
    where = f"openings[{n}] (atom {atom_text[:12]}, target {target})"

    def bad(part: str, message: str) -> RevealProblem:
        return RevealProblem(
            part=part,
            message=f"{where}: {part}: {message}",
            opening=n,
            atom=atom_text,
            target=str(target),
        )

    index = op.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < com.leaves:
        return bad("index", f"{index!r} is not a leaf of the {com.leaves} committed")
    if index in seen:
        return bad("index", f"leaf {index} is opened twice")
    seen.add(index)
    atom = _hex(op.get("atom"), 32)
    if atom is None:
        return bad("atom", "not a 64-character hex atom id")
    salt = _hex(op.get("salt"), SALT_SIZE)
    if salt is None:
        return bad("salt", f"not {2 * SALT_SIZE} hex characters")
    stated = _hex(op.get("leaf"), 32)
    if stated is None:
        return bad("leaf", "not a 64-character hex hash")
    if not isinstance(target, str):
        return bad("target", "not a string")
    proof_text = op.get("proof")
    proof = [_hex(p, 32) for p in proof_text] if isinstance(proof_text, list) else [None]
    if any(p is None for p in proof):
        return bad("proof", "not a list of 64-character hex hashes")
    steps = [p for p in proof if p is not None]
    try:
        made = merkle.leaf_hash(entry(com.set, atom, target, op.get("answer"), salt))
    except (CommitError, MedomniError) as e:
        return bad("answer", str(e))
    if merkle.root_from_proof(index, com.leaves, made, steps) == root:
        if made != stated:
            return bad("leaf", "the answer and salt open the root, but the leaf stated is another")
        return None
    if merkle.root_from_proof(index, com.leaves, stated, steps) == root:
        return bad(
            "answer/salt",
            "the leaf opens the root, but the answer and salt do not hash to it (one of them "
            "was changed)",
        )
    return bad("proof", f"its {len(steps)} steps do not lead from its leaf to the root")
