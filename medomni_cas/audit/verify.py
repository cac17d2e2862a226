"""Verify a result: re-hash every object in its closure, and say where each bad one sits.

`verify_result` walks the closure of a result breadth first, reading through the backend in
batches and hashing each object's bytes once. A missing, corrupt or unreadable object never
stops the walk: each becomes a `VerifyProblem` naming the object and its path from the result,
written the way a user reads it::

    result e0a9c90a6bab > jobs[0]: job medomni-bench.v1--baseline--encoders--r1--… >
    runs[3]: run 59d17d391725 (synth-ehr_ckd-staging@n20, patient 10000007, attempt 1) >
    answer: blob c462c8460409 is corrupt (its bytes hash to b441d6…); also linked from 6
    other runs

Fast path first, names later
    The closure is checked by the store's one checked walk
    (`medomni_cas.store.verify.walk_checked`, which shares its big levels with helper
    processes on a local store). Only when something is wrong is it walked again keeping
    the object that first links each one; then the few objects on a path are read again and
    decoded to name it, and every other referrer of a bad object is found (a shared blob is
    one object for many runs). The objects below a corrupt object are not followed through
    it (its links cannot be trusted); they are checked if something sound links them too.

What is checked
    Every object's bytes hash to its id, and every linked object is present. With
    ``canonical=True`` each object is also re-encoded and must be in canonical form (what
    ``medomni cas fsck`` does), at several times the cost. With ``derived=True`` (what
    ``medomni audit verify`` does), a sound closure's answer columns are made again from
    its answer keys (`medomni_cas.audit.derived`), and its score is computed again from its
    jobs and compared row by row, field by field, with its links to jobs, task set and set
    build checked (`medomni_cas.audit.rederive`). A `Comparison` (``medomni bench
    compare``) is verified the same way: its closure re-hashed, its answer columns made
    again, its contrasts computed again from its jobs (`medomni_cas.audit.recompare`).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable

import msgspec

from medomni_cas.audit._common import AuditError, arm_label, short
from medomni_cas.audit.commitment import Opened, check_opens
from medomni_cas.audit.derived import check_answer_column_ids, check_answer_columns
from medomni_cas.audit.recompare import check_comparison
from medomni_cas.audit.rederive import ScoreProblem, check_score
from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.records import JobRecord, Result, RunRecord
from medomni_cas.errors import IntegrityError, InvalidObject, MedomniError, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.verify import Bad, ClosureCheck, walk_checked
from medomni_cas.studio.records import (
    AnswerKey,
    AtomTask,
    BuildConfig,
    BuildResult,
    Content,
    SetBuild,
    TaskSetRecord,
)

__all__ = [
    "CORRUPT",
    "MALFORMED",
    "MISSING",
    "ScoreProblem",
    "VerifyProblem",
    "VerifyReport",
    "render_text",
    "verify_result",
]

CORRUPT = "corrupt"
MISSING = "missing"
MALFORMED = "malformed"

Progress = Callable[[int], object]  # what it returns is ignored


class VerifyProblem(msgspec.Struct, kw_only=True):
    """One bad object: ``kind`` is corrupt, missing or malformed; ``path`` the chain of
    objects from the result to it (each described), ``message`` one line saying it all."""

    kind: str
    id: str
    path: list[str]
    message: str
    got: str = ""  # what a corrupt object's bytes hash to
    linked_from: list[str] = []  # every object of the closure that links it


class VerifyReport(msgspec.Struct, kw_only=True):
    """What `verify_result` found; ``ok`` when ``problems`` is empty."""

    result: str
    ok: bool
    objects: int  # objects read and re-hashed
    bytes: int
    seconds: float
    objects_per_sec: float
    problems: list[VerifyProblem]
    processes: int = 1  # processes that re-hashed (helpers that shared the work, and this one)
    # with derived=True: each object derived from the closure (the answer columns) that is
    # not what its inputs give when made again
    derived: list[str] = []
    # with derived=True: what of the score is not what its jobs give (a row's field, a link
    # to a job, task set or set build, the Parquet table), and how much was compared
    score: list[ScoreProblem] = []
    notices: list[str] = []  # the store moved on since the score (not problems)
    rows: int = 0  # rows compared with the ones computed again
    jobs_scored: int = 0  # jobs the rows were computed again from
    # with derived=True, for a set with an answer commitment: its id, and each (atom, target)
    # whose answer key does not open it (`medomni_cas.audit.commitment`)
    commitment: str = ""
    unopened: list[str] = []
    subject: str = "result"  # what ``result`` names: "result" or "comparison"

    def __repr__(self) -> str:
        return "\n".join(render_text(self))

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(chr(10).join(render_text(self)))}</pre>"


def render_text(report: VerifyReport) -> list[str]:
    """The report as lines: the verdict, the rate, then one line per problem."""
    by = f" by {report.processes} processes" if report.processes > 1 else ""
    rate = (
        f"{report.objects:,} objects ({report.bytes:,} bytes) re-hashed in "
        f"{report.seconds:.2f} s{by}, {report.objects_per_sec:,.0f} objects/s"
    )
    notes = [f"  notice: {n}" for n in report.notices]
    if (report.rows or report.jobs_scored) and report.subject == "comparison":
        rate += (
            f"; {report.rows:,} contrasts compared with the contrasts of "
            f"{report.jobs_scored} job(s) compared again"
        )
    elif report.rows or report.jobs_scored:
        rate += (
            f"; {report.rows:,} score rows compared with the rows of {report.jobs_scored}"
            " job(s) scored again"
        )
    opened = (
        [f"  its answer keys open answer commitment {report.commitment[:12]}"]
        if report.commitment and not report.unopened
        else []
    )
    if report.ok:
        return [f"{report.subject} {report.result}: ok", f"  {rate}", *opened, *notes]
    n = len(report.problems) + len(report.derived) + len(report.score) + len(report.unopened)
    lines = [f"{report.subject} {report.result}: {n} problem(s)", f"  {rate}"]
    lines += [f"  {p.kind}: {p.message}" for p in report.problems]
    lines += [f"  derived: {d}" for d in report.derived]
    lines += [f"  {p.kind}: {p.message}" for p in report.score]
    lines += [f"  commitment: {u}" for u in report.unopened]
    return lines + notes


def verify_result(
    store: Store,
    result: str | ObjectId,
    *,
    canonical: bool = False,
    progress: Progress | None = None,
    jobs: int | None = None,
    derived: bool = False,
) -> VerifyReport:
    """Re-hash every object reachable from ``result`` (an id, a unique prefix or a ref name);
    see the module docstring. ``progress`` gets the number of objects checked so far;
    ``jobs`` is how many processes may share the work (default: one per core, up to 4; 1:
    this process only). With ``derived``, a sound closure's answer columns are also made
    again from its answer keys (`medomni_cas.audit.derived`) and its score from its jobs
    (`medomni_cas.audit.rederive`), as `medomni audit verify` does."""
    root = store.resolve(result)
    kind = _check_root(store, root, result)
    t0 = time.perf_counter()
    found = walk_checked(store, [root], canonical=canonical, jobs=jobs, progress=progress)
    seconds = time.perf_counter() - t0
    problems: list[VerifyProblem] = []
    if found.bad:
        # walked again, noting the object that first links each one: paths to name
        named = walk_checked(store, [root], canonical=canonical, parents=True)
        namer = _Namer(store, named)
        referrers = named.referrers()
        problems = [
            namer.problem(oid, bad, referrers.get(oid, []), canonical)
            for oid, bad in named.bad.items()
        ]
    # the answers it was scored against, made again (only over a sound closure)
    remade: list[str] = []
    score = None
    if derived and not problems and kind == Comparison.__kind__:
        # a comparison between arms: computed again by the comparer's own check
        compared = store.get(root, Comparison)
        remade = check_answer_column_ids(store, compared.answer_columns)
        score = check_comparison(store, root, compared)
    elif derived and not problems:
        remade = check_answer_columns(store, root)
        score = check_score(store, root)
    forged = score.problems if score is not None else []
    # the answers against the set's published commitment, when it has one
    opened = _opened(store, root) if derived and not problems else Opened()
    return VerifyReport(
        result=root.hex(),
        ok=not problems and not remade and not forged and not opened.problems,
        objects=found.objects,
        bytes=found.nbytes,
        seconds=seconds,
        objects_per_sec=found.objects / seconds if seconds > 0 else 0.0,
        problems=problems,
        processes=found.processes,
        derived=remade,
        score=forged,
        notices=(score.notices if score is not None else []) + opened.notices,
        rows=score.rows if score is not None else 0,
        jobs_scored=score.jobs if score is not None else 0,
        commitment=opened.commitment,
        unopened=opened.problems,
        subject="comparison" if kind == Comparison.__kind__ else "result",
    )


def _opened(store: Store, root: ObjectId) -> Opened:
    try:
        return check_opens(store, root)
    except MedomniError as e:  # a damaged commitment or salts record: said, not raised
        return Opened(problems=[f"the answer commitment could not be checked: {e}"])


def _check_root(store: Store, root: ObjectId, spec: str | ObjectId) -> str:
    """Refuse a sound root that is not a result (or a comparison); a damaged one is the
    walk's to report. Returns its kind ("" when it cannot be read)."""
    try:
        kind, _ = encoding.kind_of(store.get_raw(root))
    except (NotFound, IntegrityError, InvalidObject):
        return ""
    if kind not in (Result.__kind__, Comparison.__kind__):
        raise AuditError(f"{spec} is a {kind} object ({root.hex()}), not a result")
    return kind


# -- naming -------------------------------------------------------------------------------------
def _field_of(body: object, target: bytes, path: str = "") -> str | None:
    """Where in a decoded body ``target`` sits, as ``field``, ``runs[3]`` or ``a.b['x']``."""
    if type(body) is ObjectId:
        return path if body == target else None
    if isinstance(body, msgspec.Struct):
        body = msgspec.structs.asdict(body)
    if isinstance(body, dict):
        for k, v in body.items():
            sub = (
                f"{path}.{k}"
                if path and str(k).isidentifier()
                else (str(k) if not path else f"{path}[{k!r}]")
            )
            got = _field_of(v, target, sub)
            if got is not None:
                return got
    elif isinstance(body, list | tuple):
        for i, v in enumerate(body):
            got = _field_of(v, target, f"{path}[{i}]")
            if got is not None:
                return got
    return None


_NOUNS = {
    "medomni.run": "run",
    "medomni.atom-task": "atom task",
    "medomni.job": "job",
    "medomni.build": "build",
    "medomni.content": "content",
    "medomni.answer-key": "answer key",
    "medomni.prediction": "prediction record",
    "medomni.result": "result",
    "medomni.comparison": "comparison",
}


def _noun(kind: str, n: int) -> str:
    word = _NOUNS.get(kind, kind)
    return word + ("s" if n != 1 else "")


class _Namer:
    """Describes the objects on the path from the result to a bad one (read on demand)."""

    def __init__(self, store: Store, check: ClosureCheck) -> None:
        self.store = store
        self.check = check
        self.parent = check.parent
        self.bad = check.bad
        self.decoded: dict[bytes, tuple[str, object]] = {}

    def _get(self, oid: bytes) -> tuple[str, object]:
        got = self.decoded.get(oid)
        if got is None:
            kind, _, body = encoding.decode(self.store.get_raw(ObjectId(oid)))
            if kind == TREE:
                body = dict(body)
            got = self.decoded[oid] = (kind, body)
        return got

    def describe(self, oid: bytes) -> str:
        kind, body = self._get(oid)
        s = short(oid)
        match body:
            case Result():
                return f"result {s}"
            case Comparison():
                return f"comparison {s}"
            case JobRecord():
                return f"job {body.name}"
            case RunRecord():
                patient = self._patient(body.atom)
                who = f", patient {patient}" if patient else ""
                return f"run {s} ({body.pair}{who}, attempt {body.attempt})"
            case AtomTask():
                label = arm_label(body.arm, body.arm_variant)
                return f"atom task {s} ({body.pair} {label}, patient {body.patient})"
            case BuildResult():
                return f"build {s} ({body.pair} {arm_label(body.arm, body.arm_variant)})"
            case BuildConfig():
                return f"build config {s} ({body.pair} {arm_label(body.arm, body.arm_variant)})"
            case SetBuild():
                return f"set build {s}"
            case TaskSetRecord():
                return f"task set {s} ({body.name})"
            case Content():
                return f"content {s} ({body.pair})"
            case AnswerKey():
                return f"answer key {s}"
        return f"{kind} {s}"

    def _patient(self, atom: ObjectId) -> str:
        if atom in self.bad or atom not in self.parent:
            return ""  # a bad atom (or one not reached): its run is named without it
        _, body = self._get(atom)
        return body.patient if isinstance(body, AtomTask) else ""

    def _chain(self, oid: bytes) -> list[bytes]:
        chain = [oid]
        while (up := self.parent.get(chain[-1])) is not None:
            chain.append(up)
        chain.reverse()
        return chain

    def problem(
        self, oid: bytes, bad: Bad, referrers: list[bytes], canonical: bool
    ) -> VerifyProblem:
        kind, detail = bad
        if kind == MALFORMED and not canonical:
            detail = f"its links cannot be read: {detail}"
        chain = self._chain(oid)
        steps: list[str] = []
        for i, node in enumerate(chain[:-1]):
            text = self.describe(node)
            if i:
                text = f"{self._edge(chain[i - 1], node)}: {text}"
            steps.append(text)
        what = self._what(oid, kind)
        if len(chain) > 1:
            what = f"{self._edge(chain[-2], oid)}: {what}"
        if kind == CORRUPT:
            state = f"is corrupt (its bytes hash to {detail})"
        elif kind == MISSING:
            state = "is missing"
        else:
            state = f"is malformed: {detail}"
        message = " > ".join([*steps, f"{what} {state}"])
        others = [r for r in referrers if len(chain) < 2 or r != chain[-2]]
        if others:
            message += f"; also linked from {self._count_kinds(others)}"
        return VerifyProblem(
            kind=kind,
            id=bytes(oid).hex(),
            path=[*steps, what],
            message=message,
            got=detail if kind == CORRUPT else "",
            linked_from=[bytes(r).hex() for r in referrers],
        )

    def _count_kinds(self, ids: list[bytes]) -> str:
        """``19 other runs`` or ``2 other trees, 1 other atom task``."""
        kinds: dict[str, int] = {}
        for r in ids:
            kind = self._get(r)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        return ", ".join(f"{n} other {_noun(k, n)}" for k, n in kinds.items())

    def _edge(self, parent: bytes, child: bytes) -> str:
        _, body = self._get(parent)
        return _field_of(body, child) or "link"

    def _what(self, oid: bytes, kind: str) -> str:
        """The bad object itself, with its kind when its (damaged) bytes still name a known
        one: a flipped bit elsewhere leaves ``blob`` readable, a flipped kind does not."""
        stored = None if kind == MISSING else self.check.stored_kind(oid)
        if stored is None:
            return f"object {short(oid)}"
        k, version = stored
        if k in (BLOB, TREE):
            return f"{k} {short(oid)}"
        cls = encoding.record_class(k, version)
        if cls is None:
            return f"object {short(oid)}"
        return f"{_NOUNS.get(k, k)} {short(oid)}"
