"""in-toto Statements about what the store holds: made from the store, the same way twice.

A statement is the in-toto Statement v1 JSON object::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "results/<set>",
                  "digest": {"blake3": "<result id>", "sha256": "<of its canonical bytes>"}}],
     "predicateType": "https://in-toto.io/attestation/test-result/v0.1",
     "predicate": {...}}

Subjects by kind
    What can be attested is looked up by the subject's record kind (`SUBJECTS`): a
    `Result` (name ``results/<set>``, the test-result predicate below), a `Comparison`
    between arms (``comparisons/<set>``, the same predicate, its contrast rows in
    ``medomni``) and an `AnswerCommitment` (name ``commitments/<set>``, predicate
    `COMMITMENT_PREDICATE`: the set, root, leaf count and scheme, so the owner can sign the
    root published before any run); a kind added later adds one `SubjectKind`. The blake3
    digest *is* the object's id, and the sha256 is over the same canonical bytes, for
    tools that know only SHA-2.
The test-result predicate (v0.1)
    ``result`` is ``PASSED`` when `medomni audit verify` finds nothing wrong, ``WARNED``
    when it finds nothing wrong but the store moved on since the score (a job re-run after
    it), ``FAILED`` otherwise; ``passedTests`` / ``warnedTests`` / ``failedTests`` name its
    checks (`CHECKS`). ``configuration`` lists resource descriptors of what the score was
    computed under: the task set, its set build, every build config (pair, arm), every
    agent config, and the scorer (version, n_boot, seed). The scores themselves, which the
    predicate has no field for, are in its extension field ``medomni`` (in-toto consumers
    ignore fields they do not know): the result's fields and every row.

`statement` makes the statement from the store; a verifier makes it again and compares
(`medomni_cas.audit.attest`), so nothing in it may depend on when or where it is made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from medomni_cas.audit._common import AuditError, arm_label
from medomni_cas.audit.verify import VerifyReport, verify_result
from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.records import AgentConfig, JobRecord, Result
from medomni_cas.bench.refnames import result_ref
from medomni_cas.errors import InvalidName, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio import merkle
from medomni_cas.studio.commitments import AnswerCommitment, AnswerSalts
from medomni_cas.studio.records import SetBuild, TaskSetRecord
from medomni_cas.studio.refnames import answer_salts_ref, set_build_ref, task_set_ref

__all__ = [
    "CHECKS",
    "COMMITMENT_PREDICATE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "Check",
    "SubjectKind",
    "SUBJECTS",
    "resolve_subject",
    "result_check",
    "statement",
    "subject_kind",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
#: The checks of a result's verification, as the predicate's test names
#: (``answer-commitment`` only for a set that has one: `medomni_cas.audit.commitment`).
CHECKS = ("closure", "answer-columns", "score", "answer-commitment")


@dataclass(frozen=True)
class Check:
    """What verifying a subject found: the predicate's ``result`` and its test names, and
    the messages behind each failed one (reported, not signed)."""

    result: str  # PASSED | WARNED | FAILED
    passed: tuple[str, ...]
    failed: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()
    messages: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class SubjectKind:
    """How to attest objects of one record kind.

    ``what`` is the word in ref names and messages (``result``); ``set_name`` gives the
    set the object belongs to; ``check`` verifies it (as `medomni audit verify` would);
    ``describe`` gives the predicate's configuration descriptors and its ``medomni``
    extension."""

    kind: str
    what: str
    predicate_type: str
    set_name: Callable[[Store, ObjectId], str]
    check: Callable[[Store, ObjectId], Check]
    describe: Callable[[Store, ObjectId, Check], dict[str, Any]]


SUBJECTS: dict[str, SubjectKind] = {}


def subject_kind(store: Store, oid: ObjectId) -> SubjectKind:
    """The `SubjectKind` of the object ``oid`` (its kind read from its bytes)."""
    kind, _ = encoding.kind_of(store.get_raw(oid))
    found = SUBJECTS.get(kind)
    if found is None:
        can = ", ".join(s.what for s in SUBJECTS.values())
        raise AuditError(f"{oid.hex()} is a {kind} object; an attestation is of a {can}")
    return found


def resolve_subject(store: Store, spec: str | ObjectId) -> ObjectId:
    """A subject by set name (its latest score, ``results/<set>``), ref name, id or prefix."""
    if isinstance(spec, ObjectId):
        return spec
    try:
        rid = store.refs.get(result_ref(spec))
    except InvalidName:  # an id, a prefix or a ref name is no set name
        rid = None
    return rid if rid is not None else store.resolve(spec)


def _digest(oid: ObjectId, data: bytes) -> dict[str, str]:
    return {"blake3": oid.hex(), "sha256": hashlib.sha256(data).hexdigest()}


def statement(store: Store, oid: ObjectId, check: Check | None = None) -> dict[str, Any]:
    """The in-toto Statement about ``oid`` (checked now unless ``check`` is given)."""
    sk = subject_kind(store, oid)
    data = store.get_raw(oid)
    if check is None:
        check = sk.check(store, oid)
    name = f"{_subject_prefix(sk)}{sk.set_name(store, oid)}"
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": _digest(oid, data)}],
        "predicateType": sk.predicate_type,
        "predicate": sk.describe(store, oid, check),
    }


def _subject_prefix(sk: SubjectKind) -> str:
    return "results/" if sk.what == "result" else f"{sk.what}s/"


# -- results --------------------------------------------------------------------------------------
def _result_set(store: Store, oid: ObjectId) -> str:
    return store.get(store.get(oid, Result).task_set, TaskSetRecord).name


def _check_result(store: Store, oid: ObjectId) -> Check:
    return result_check(verify_result(store, oid, derived=True, jobs=1))


def result_check(report: VerifyReport) -> Check:
    """The predicate's result and test names from what `verify_result` (``derived=True``)
    found, for a caller that has just verified the result (the demo)."""
    failed = {
        "closure": [p.message for p in report.problems],
        "answer-columns": list(report.derived),
        "score": [p.message for p in report.score],
    }
    # a set with no answer commitment (or whose salts are elsewhere) has nothing to open
    if report.commitment:
        failed["answer-commitment"] = list(report.unopened)
    bad = tuple(k for k in CHECKS if failed.get(k))
    good = tuple(k for k in CHECKS if k in failed and not failed[k])
    warned = ("store-moved-on",) if report.notices else ()
    messages = tuple(m for k in CHECKS for m in failed.get(k, ())) + tuple(report.notices)
    result = "FAILED" if bad else "WARNED" if warned else "PASSED"
    return Check(result, good, bad, warned, messages)


def _descriptor(name: str, oid: ObjectId, **annotations: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "digest": {"blake3": oid.hex()}}
    if annotations:
        d["annotations"] = annotations
    return d


def _configuration(
    store: Store, set_name: str, task_set: ObjectId, set_build: ObjectId, jobs: Sequence[ObjectId]
) -> list[dict[str, Any]]:
    """The resource descriptors of what a score (or comparison) of the set build and jobs
    was computed under: the task set, the set build, each build config, each agent config,
    and the set's answer commitment when it has one."""
    config: list[dict[str, Any]] = [
        _descriptor(task_set_ref(set_name), task_set),
        _descriptor(set_build_ref(set_name), set_build),
    ]
    try:
        sb = store.get(set_build, SetBuild)
        for e in sb.entries:
            label = arm_label(e.arm, e.arm_variant)
            config.append(_descriptor(f"configs/{e.pair}/{label}", e.config, version=e.version))
    except MedomniError:
        pass  # a damaged set build: the check says so; the statement lists what it can
    agents: dict[ObjectId, str] = {}
    for jid in jobs:
        try:
            agents.setdefault(store.get(jid, JobRecord).agent_config, "")
        except MedomniError:
            continue
    for ac in agents:
        try:
            name = store.get(ac, AgentConfig).name
        except MedomniError:
            name = ac.hex()[:12]
        config.append(_descriptor(f"agents/{name}", ac))
    from medomni_cas.audit.commitment import commitment_descriptor

    committed = commitment_descriptor(store, set_name)
    return config + ([committed] if committed is not None else [])


def _describe_result(store: Store, oid: ObjectId, check: Check) -> dict[str, Any]:
    res = store.get(oid, Result)
    ts = store.get(res.task_set, TaskSetRecord)
    config = _configuration(store, ts.name, res.task_set, res.set_build, res.jobs)
    config.append(
        {
            "name": f"scorer/{res.scorer}",
            "uri": f"urn:medomni:scorer:{res.scorer}@{res.scorer_version}",
            "annotations": {"version": res.scorer_version, "n_boot": res.n_boot, "seed": res.seed},
        }
    )
    predicate: dict[str, Any] = {
        "result": check.result,
        "configuration": config,
        "passedTests": list(check.passed),
        "warnedTests": list(check.warned),
        "failedTests": list(check.failed),
        "medomni": {
            "subject": {"kind": Result.__kind__, "id": oid.hex()},
            "set": ts.name,
            "scorer": res.scorer,
            "scorer_version": res.scorer_version,
            "n_boot": res.n_boot,
            "seed": res.seed,
            "partial": res.partial,
            "arms": list(res.arms),
            "table": res.table.hex(),
            "rows": [msgspec.to_builtins(r) for r in res.rows],
        },
    }
    return predicate


SUBJECTS[Result.__kind__] = SubjectKind(
    kind=Result.__kind__,
    what="result",
    predicate_type=PREDICATE_TYPE,
    set_name=_result_set,
    check=_check_result,
    describe=_describe_result,
)


# -- comparisons ----------------------------------------------------------------------------------
def _comparison_set(store: Store, oid: ObjectId) -> str:
    return store.get(store.get(oid, Comparison).task_set, TaskSetRecord).name


def _describe_comparison(store: Store, oid: ObjectId, check: Check) -> dict[str, Any]:
    com = store.get(oid, Comparison)
    ts = store.get(com.task_set, TaskSetRecord)
    config = _configuration(store, ts.name, com.task_set, com.set_build, com.jobs)
    config.append(
        {
            "name": f"comparer/{com.comparer}",
            "uri": f"urn:medomni:comparer:{com.comparer}@{com.comparer_version}",
            "annotations": {
                "version": com.comparer_version,
                "n_boot": com.n_boot,
                "seed": com.seed,
            },
        }
    )
    return {
        "result": check.result,
        "configuration": config,
        "passedTests": list(check.passed),
        "warnedTests": list(check.warned),
        "failedTests": list(check.failed),
        "medomni": {
            "subject": {"kind": Comparison.__kind__, "id": oid.hex()},
            "set": ts.name,
            "comparer": com.comparer,
            "comparer_version": com.comparer_version,
            "n_boot": com.n_boot,
            "seed": com.seed,
            "asked": [list(a) for a in com.asked],
            "agents": list(com.agents),
            "table": com.table.hex(),
            "rows": [msgspec.to_builtins(r) for r in com.rows],
        },
    }


SUBJECTS[Comparison.__kind__] = SubjectKind(
    kind=Comparison.__kind__,
    what="comparison",
    predicate_type=PREDICATE_TYPE,
    set_name=_comparison_set,
    check=_check_result,  # audit verify computes a comparison again as it does a score
    describe=_describe_comparison,
)


# -- answer commitments ---------------------------------------------------------------------------
#: The predicate of an attested answer commitment: the owner signs the root it published.
COMMITMENT_PREDICATE = "https://medomni.dev/attestation/answer-commitment/v1"


def _commitment_set(store: Store, oid: ObjectId) -> str:
    return store.get(oid, AnswerCommitment).set


def _check_commitment(store: Store, oid: ObjectId) -> Check:
    """A commitment is sound when it decodes and its task set is the set it names; where
    its salts are kept, they must build its root."""
    com = store.get(oid, AnswerCommitment)
    failed: dict[str, list[str]] = {"commitment": []}
    try:
        name = store.get(com.task_set, TaskSetRecord).name
        if name != com.set:
            failed["commitment"].append(f"it names set {com.set}, its task set is {name}")
    except MedomniError as e:
        failed["commitment"].append(f"its task set cannot be read: {e}")
    sid = store.refs.get(answer_salts_ref(com.set))
    salts = store.get(sid, AnswerSalts) if sid is not None else None
    if salts is not None and salts.commitment == oid:
        built = merkle.root([s.leaf for s in salts.leaves]).hex()
        failed["salts"] = [] if built == com.root else [f"the salts kept build root {built}"]
    bad = tuple(k for k in failed if failed[k])
    good = tuple(k for k in failed if not failed[k])
    messages = tuple(m for k in failed for m in failed[k])
    return Check("FAILED" if bad else "PASSED", good, bad, (), messages)


def _describe_commitment(store: Store, oid: ObjectId, check: Check) -> dict[str, Any]:
    com = store.get(oid, AnswerCommitment)
    return {
        "result": check.result,
        "passedTests": list(check.passed),
        "failedTests": list(check.failed),
        "set": com.set,
        "task_set": com.task_set.hex(),
        "set_build": com.set_build,
        "scheme": com.scheme,
        "root": com.root,
        "leaves": com.leaves,
    }


SUBJECTS[AnswerCommitment.__kind__] = SubjectKind(
    kind=AnswerCommitment.__kind__,
    what="commitment",
    predicate_type=COMMITMENT_PREDICATE,
    set_name=_commitment_set,
    check=_check_commitment,
    describe=_describe_commitment,
)
