"""Staging an atom task as files: what an agent sees, and nothing else.

The layout every runner stages (the Harbor task folder adds its own around it)::

    instruction.md        the atom's instruction
    answer_schema.json    the answer's shape (targets, kinds, classes): no answer in it
    <evidence files>      the staged families only, e.g. labs.jsonl, ecg.signal.npy

The agent's working folder stands for ``/workspace``: a submission path of
``/workspace/answer.json`` is ``answer.json`` in it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import msgspec

from medomni_cas.errors import InvalidName
from medomni_cas.store.store import Store
from medomni_cas.store.trees import export_tree
from medomni_cas.studio.records import SCORES_KEY, AtomTask, FormatCheck

__all__ = ["WORKSPACE", "answer_schema", "stage_atom", "submission_file"]

WORKSPACE = PurePosixPath("/workspace")
RESERVED = ("instruction.md", "answer_schema.json")


def answer_schema(check: FormatCheck) -> bytes:
    """The format check's shape as JSON, for agents that read it rather than the prose."""
    targets = [
        {"name": t.name, "kind": t.kind, "classes": list(t.classes), "question": t.question}
        for t in check.targets
    ]
    doc = {
        "targets": targets,
        "optional": {
            SCORES_KEY: "class probabilities, {target: {class: probability}}, for class "
            "targets; the scorer reports AUROC from them"
        },
    }
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def submission_file(atom: AtomTask, workdir: Path) -> Path:
    """Where the answer is, in ``workdir`` standing for /workspace; refuses paths outside."""
    p = PurePosixPath(atom.submission_path)
    try:
        rel = p.relative_to(WORKSPACE) if p.is_absolute() else p
    except ValueError:
        raise InvalidName(
            f"submission path {atom.submission_path!r} is not under {WORKSPACE}"
        ) from None
    if not rel.parts or ".." in rel.parts:
        raise InvalidName(f"submission path {atom.submission_path!r} leaves {WORKSPACE}")
    return workdir.joinpath(*rel.parts)


def stage_atom(store: Store, atom: AtomTask, check: FormatCheck, workdir: Path) -> Path:
    """Write the atom's files into the empty folder ``workdir``; return the answer's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    export_tree(store, atom.evidence, workdir)
    for name in RESERVED:
        if (workdir / name).exists():
            raise InvalidName(f"evidence file {name!r} would hide the staged {name}")
    (workdir / "instruction.md").write_bytes(store.read_blob(atom.instruction))
    (workdir / "answer_schema.json").write_bytes(answer_schema(check))
    answer = submission_file(atom, workdir)
    answer.parent.mkdir(parents=True, exist_ok=True)
    return answer
