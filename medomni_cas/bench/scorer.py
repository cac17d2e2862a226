"""The scorer: prediction records and answer keys -> a `Result`, as pyarrow columns.

Reads each job's predictions as columns (`medomni_cas.bench.columns`), never one object per
prediction, against its arm's `AnswerColumns` (derived from the answer keys once and kept):
a job whose atom and target columns are the answers' own objects lines up row for row and
only its answer column is read; any other (a `PredictionTable` of older jobs, say) is
joined on (atom, target). Each (agent, arm, rung, pair, target) is scored with the metric
its template names, with a percentile bootstrap interval. An atom with no valid answer
counts against the agent (see `medomni_cas.bench.metrics` for how each metric treats it).

Jobs of different task sets are never put in one table (a clear error). A row whose runs
were built under more than one config hash, or whose config hash differs from another
agent's row for the same pair and arm, is flagged in ``config_flag``.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medomni_cas.bench.columns import (
    SLOT_COLUMNS,
    Truths,
    answer_columns,
    arm_slots,
    read_column,
    read_or_nulls,
    read_predictions,
)
from medomni_cas.bench.metrics import score as metric_score
from medomni_cas.bench.records import (
    AgentConfig,
    AnswerColumns,
    JobRecord,
    PredictionColumns,
    Result,
    ScoreRow,
)
from medomni_cas.bench.refnames import JOB_REFS, answers_ref, result_ref
from medomni_cas.bench.schemas import SCORE_SCHEMA
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import SetBuild

__all__ = [
    "SCORER",
    "SCORER_VERSION",
    "SCORER_VERSIONS",
    "ScoreError",
    "Derived",
    "Gap",
    "PartialScore",
    "Scored",
    "coverage_gaps",
    "derive",
    "expected_jobs",
    "jobs_of",
    "prediction_table",
    "row_dicts",
    "rows_table",
    "score_jobs",
    "write_results",
]

SCORER = "medomni-scorer"
SCORER_VERSION = "1.1.0"
#: Versions `derive` computes: 1.0.0 rows had no coverage fields (a result it wrote still
#: verifies); 1.1.0 adds them, the task set hash, and rows for jobs never recorded.
SCORER_VERSIONS = ("1.0.0", "1.1.0")

# Threads reading jobs' columns ahead of the one being scored: two keep both cores of a
# small machine busy; more only hold more jobs' columns in memory at once.
_READERS = 2


class ScoreError(MedomniError, ValueError):
    """Jobs that cannot be scored together, or nothing to score."""


@dataclass(frozen=True)
class Gap:
    """Slots a score would need that have no final run: of a recorded job, or of a job
    (arm, rung, repetition) never recorded (``job`` None)."""

    agent: str
    arm: str
    arm_variant: str
    repetition: int
    expected: int
    never_run: int
    job: ObjectId | None

    def __str__(self) -> str:
        where = f"{self.agent} {arm_label(self.arm, self.arm_variant)} r{self.repetition}"
        if self.job is None:
            return f"{where}: no job recorded ({self.expected} slots never run)"
        return f"{where}: {self.never_run} of {self.expected} slots never run"


class PartialScore(MedomniError):
    """Some slot the score needs has no final run, and a partial score was not allowed;
    nothing was written. ``gaps`` names each job."""

    def __init__(self, gaps: Sequence[Gap]) -> None:
        self.gaps = list(gaps)
        slots = sum(g.never_run for g in gaps)
        shown = "\n  ".join(str(g) for g in gaps[:20])
        more = f"\n  ... and {len(gaps) - 20} more" if len(gaps) > 20 else ""
        super().__init__(
            f"{slots} slot(s) the score needs have no final run; nothing was scored:\n  "
            f"{shown}{more}\nrun them (`medomni bench run`; run it again after sharded runs "
            "to record each job whole), or score what there is with --allow-partial"
        )


def prediction_table(store: Store, job: JobRecord) -> pa.Table:
    """A job's predictions as one Arrow table (see `read_predictions`)."""
    return read_predictions(store, job)


def jobs_of(
    store: Store, task_set: ObjectId, agents: Sequence[str] | None = None
) -> list[ObjectId]:
    """Every recorded job of ``task_set`` (optionally of some agents), in a stable order."""
    out = []
    for _, jid in sorted(store.refs.items(JOB_REFS)):
        job = store.get(jid, JobRecord)
        if job.task_set != task_set:
            continue
        if agents:
            name = store.get(job.agent_config, AgentConfig).name
            if name not in agents:
                continue
        out.append(jid)
    return out


@dataclass
class _Answers:
    """An arm's answer columns as the scorer reads them: truth once, key columns if a job
    needs joining."""

    id: ObjectId
    record: AnswerColumns
    truth_text: pa.Array
    truth_num: pa.Array
    _key: pa.Table | None = None

    def key(self, store: Store) -> pa.Table:
        """``atom``, ``target`` and each row's number, for joining a job that does not line up."""
        if self._key is None:
            cols = self.record.columns
            self._key = pa.table(
                {
                    "atom": read_column(store, cols["atom"], "atom"),
                    "target": read_column(store, cols["target"], "target"),
                    "row": pa.array(np.arange(self.record.rows, dtype=np.int64)),
                }
            )
        return self._key


def _answers(
    store: Store, set_build: ObjectId, arm: str, arm_variant: str, truths: Truths
) -> _Answers:
    aid, record = answer_columns(store, set_build, arm, arm_variant, truths)
    return _answers_of(store, aid, record)


def _answers_of(store: Store, aid: ObjectId, record: AnswerColumns) -> _Answers:
    """Answer columns already stored (``aid``, a result's) as the scorer reads them."""
    cols, n = record.columns, record.rows
    return _Answers(
        aid,
        record,
        read_or_nulls(store, cols, "truth_text", n, pa.string()),
        read_or_nulls(store, cols, "truth_num", n, pa.float64()),
    )


@dataclass
class _Predictions:
    """A job's columns in its arm's answer rows; None where the job has none."""

    value_text: pa.Array | None
    value_num: pa.Array | None
    attempt: pa.Array | None
    scores: pa.Array | None
    config: pa.Array | None  # the runs' config hashes; None when they are the key's own
    status: pa.Array  # each row's slot: "answered", why not, or null when it never ran
    runner: pa.Array | None = None  # None in jobs recorded before runs said
    isolation: pa.Array | None = None


def _plain(array: pa.Array) -> pa.Array:
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _predictions(
    store: Store, job: JobRecord, answers: _Answers, *, columns: frozenset[str] | None = None
) -> _Predictions:
    """Read only what the answers' groups score: a job whose key columns are the answers'
    own objects lines up row for row; any other is joined on (atom, target). ``columns``:
    only these of a lined-up job's columns are read (the comparer's; None: the scorer's)."""
    record = store.get(job.predictions)
    key = answers.record
    if (
        isinstance(record, PredictionColumns)
        and record.rows == key.rows
        and all(record.columns.get(c) == key.columns[c] for c in ("atom", "target"))
    ):
        # only the columns the groups score (text targets: answers and class probabilities)
        numeric = any(g.numeric for g in key.groups)
        text = not all(g.numeric for g in key.groups)

        def column(name: str, needed: bool = True, plain: bool = True) -> pa.Array | None:
            needed = needed and (columns is None or name in columns)
            blob = record.columns.get(name) if needed else None
            return None if blob is None else read_column(store, blob, name, plain=plain)

        # counted, never compared row by row: kept dictionary-encoded (a code a row)
        status = column("status", plain=False)
        if status is None:  # jobs recorded before status: the outcome
            status = column("outcome", plain=False)
        return _Predictions(
            column("value_text", text),
            column("value_num", numeric),
            column("attempt"),
            column("scores", text),
            None,
            status if status is not None else pa.nulls(key.rows, pa.string()),
            column("runner", plain=False),
            column("isolation", plain=False),
        )
    table = read_predictions(store, job, extra=SLOT_COLUMNS)
    joined = answers.key(store).join(
        table.select(
            [
                "atom",
                "target",
                "value_text",
                "value_num",
                "attempt",
                "scores",
                "config",
                "outcome",
                *SLOT_COLUMNS,
            ]
        ),
        keys=["atom", "target"],
        join_type="left outer",
    )
    if joined.num_rows != key.rows:
        raise ScoreError(f"job {job.name}: its predictions list some (atom, target) more than once")
    joined = joined.sort_by("row")  # back in the answers' order, which the groups index

    def joined_column(name: str) -> pa.Array:
        return _plain(joined[name].combine_chunks())

    status = joined_column("status")
    if status.null_count == len(status):
        status = joined_column("outcome")
    runner = joined_column("runner")
    isolation = joined_column("isolation")
    return _Predictions(
        joined_column("value_text"),
        joined_column("value_num"),
        joined_column("attempt"),
        joined_column("scores"),
        joined_column("config"),
        status,
        None if runner.null_count == len(runner) else runner,
        None if isolation.null_count == len(isolation) else isolation,
    )


def _never_run(rows: int) -> _Predictions:
    """The columns of a job that was never recorded: every row's slot never ran."""
    return _Predictions(None, None, None, None, None, pa.nulls(rows, pa.string()))


@dataclass(frozen=True)
class Scored:
    result: ObjectId
    record: Result
    table: pa.Table


@dataclass(frozen=True)
class Derived:
    """A score as the scorer computes it from jobs, before anything is stored: what
    `score_jobs` stores as a `Result`, and what ``audit verify`` computes again to compare."""

    task_set: ObjectId
    set_build: ObjectId
    rows: tuple[ScoreRow, ...]
    answer_keys: tuple[ObjectId, ...]
    answer_columns: tuple[ObjectId, ...]


def expected_jobs(
    store: Store, records: Sequence[JobRecord], arms: Sequence[str] = ()
) -> set[tuple[ObjectId, str, str, int]]:
    """The jobs a complete score of ``records`` needs, as (agent config, arm, arm variant,
    repetition): every arm (and rung) of the set build, or those of the arm labels
    ``arms``, for each agent and repetition the records hold."""
    if not records:
        return set()
    build = store.get(records[-1].set_build, SetBuild)
    every = dict.fromkeys((e.arm, e.arm_variant) for e in build.entries)
    chosen = set(arms)
    wanted = [a for a in every if not chosen or arm_label(*a) in chosen]
    reps: dict[ObjectId, set[int]] = {}
    for r in records:
        reps.setdefault(r.agent_config, set()).add(r.repetition)
    return {(agent, *arm, rep) for agent, rs in reps.items() for arm in wanted for rep in rs}


def _arm_size(store: Store, build: ObjectId, arm: str, variant: str) -> int:
    """An arm's slots: from its answer columns when the scorer kept them (one small record),
    else from the build's atoms."""
    kept = store.refs.get(answers_ref(build, arm_label(arm, variant)))
    if kept is not None:
        record = store.get(kept, AnswerColumns)
        first: dict[str, int] = {}
        for g in record.groups:  # each pair's atoms, once (its first target's rows)
            first.setdefault(g.pair, g.stop - g.start)
        return sum(first.values())
    return arm_slots(store, build, arm, variant)


def coverage_gaps(store: Store, jobs: Sequence[ObjectId], arms: Sequence[str] = ()) -> list[Gap]:
    """Every job of ``jobs`` with slots never run, and every job a complete score needs
    (`expected_jobs` of the arm labels ``arms``, default all) that is not among them: read
    from the job records alone."""
    return _gaps(store, jobs, [store.get(j, JobRecord) for j in jobs], arms)


def _gaps(
    store: Store, jobs: Sequence[ObjectId], records: Sequence[JobRecord], arms: Sequence[str]
) -> list[Gap]:
    if not records:
        return []
    names: dict[ObjectId, str] = {}

    def name(agent: ObjectId) -> str:
        if agent not in names:
            names[agent] = store.get(agent, AgentConfig).name
        return names[agent]

    sizes: dict[tuple[ObjectId, str, str], int] = {}

    def size(build: ObjectId, arm: str, variant: str) -> int:
        if (build, arm, variant) not in sizes:
            sizes[(build, arm, variant)] = _arm_size(store, build, arm, variant)
        return sizes[(build, arm, variant)]

    gaps = []
    for jid, r in zip(jobs, records, strict=True):
        expected = size(r.set_build, r.arm, r.arm_variant)
        if len(r.runs) < expected:
            gaps.append(
                Gap(
                    name(r.agent_config),
                    r.arm,
                    r.arm_variant,
                    r.repetition,
                    expected,
                    expected - len(r.runs),
                    jid,
                )
            )
    have = {(r.agent_config, r.arm, r.arm_variant, r.repetition) for r in records}
    build = records[-1].set_build
    for agent, arm, variant, rep in sorted(expected_jobs(store, records, arms) - have):
        expected = size(build, arm, variant)
        gaps.append(Gap(name(agent), arm, variant, rep, expected, expected, None))
    return gaps


def derive(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    scorer_version: str = SCORER_VERSION,
    arms: Sequence[str] = (),
) -> Derived:
    """Score ``jobs`` (all of one task set) without storing a result (the answer columns it
    needs are made and kept, as they are derived objects).

    ``arms`` (arm labels; default all) are those a complete score covers: a job of them
    never recorded gets rows of slots never run. ``scorer_version`` "1.0.0" gives the rows
    that version wrote (no coverage fields, no rows for jobs never recorded), so that
    ``audit verify`` can re-derive its results."""
    return _derive(
        store, [store.get(j, JobRecord) for j in jobs], n_boot, seed, scorer_version, arms
    )


def _derive(
    store: Store,
    records: Sequence[JobRecord],
    n_boot: int,
    seed: int,
    scorer_version: str,
    arms: Sequence[str],
) -> Derived:
    if scorer_version not in SCORER_VERSIONS:
        raise ScoreError(
            f"scorer version {scorer_version!r} is not one this scorer can compute "
            f"(it computes {', '.join(SCORER_VERSIONS)})"
        )
    legacy = scorer_version == "1.0.0"
    if not records:
        raise ScoreError("no jobs to score: run the set first (`medomni bench run`)")
    sets = {r.task_set for r in records}
    if len(sets) > 1:
        raise ScoreError(
            "these jobs come from different task sets ("
            + ", ".join(sorted(s.hex()[:12] for s in sets))
            + "); scores of different task set hashes are never put in one table"
        )
    names = {r.agent_config: store.get(r.agent_config, AgentConfig).name for r in records}
    answers: dict[tuple[ObjectId, str, str], _Answers] = {}
    truths: Truths = {}  # answer keys read for one arm, for the next
    rows: list[ScoreRow] = []
    task_set = records[0].task_set
    set_build = records[-1].set_build

    def arm_answers(build: ObjectId, arm: str, variant: str) -> _Answers:
        if (build, arm, variant) not in answers:
            answers[(build, arm, variant)] = _answers(store, build, arm, variant, truths)
        return answers[(build, arm, variant)]

    # the next jobs' columns are read (blob reads, hashing, Arrow decoding: mostly outside
    # the GIL) while this one's are scored; the answers are made here, in order
    pending: deque[tuple[JobRecord, _Answers, Future[_Predictions]]] = deque()
    upcoming = iter(records)

    def read_ahead(pool: ThreadPoolExecutor) -> None:
        job = next(upcoming, None)
        if job is not None:
            a = arm_answers(job.set_build, job.arm, job.arm_variant)
            pending.append((job, a, pool.submit(_predictions, store, job, a)))

    with ThreadPoolExecutor(_READERS, thread_name_prefix="medomni-score") as pool:
        for _ in range(_READERS + 1):
            read_ahead(pool)
        while pending:
            job, a, future = pending.popleft()
            read_ahead(pool)
            rows += _rows(
                a,
                future.result(),
                names[job.agent_config],
                job.arm,
                job.arm_variant,
                job.runner,
                n_boot,
                seed,
                legacy,
            )
    if not legacy:
        have = {(r.agent_config, r.arm, r.arm_variant, r.repetition) for r in records}
        for agent, arm, variant, _rep in sorted(expected_jobs(store, records, arms) - have):
            a = arm_answers(set_build, arm, variant)
            never = _never_run(a.record.rows)
            rows += _rows(a, never, names[agent], arm, variant, "", n_boot, seed, legacy)
        rows = [msgspec.structs.replace(r, task_set=task_set.hex()) for r in _flag_runs(rows)]
    rows = sorted(_flag(rows), key=lambda r: (r.agent, r.arm, r.arm_variant, r.pair, r.target))
    answer_keys = dict.fromkeys(k for a in answers.values() for k in a.record.answer_keys)
    return Derived(
        task_set=task_set,
        set_build=set_build,
        rows=tuple(rows),
        answer_keys=tuple(answer_keys),
        answer_columns=tuple(a.id for a in answers.values()),
    )


def score_jobs(
    store: Store,
    jobs: Sequence[ObjectId],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    set_name: str | None = None,
    allow_partial: bool = False,
    arms: Sequence[str] = (),
) -> Scored:
    """Score ``jobs`` (all of one task set) into a stored `Result`.

    A score needs a final run of every slot of every arm for each agent and repetition
    scored (or of the arm labels ``arms``, when the caller chose some: then ``jobs`` must
    be of those arms): `PartialScore` (nothing written, no ref moved) names the gaps,
    unless ``allow_partial``; then the result and its rows with gaps say ``partial``."""
    arms = tuple(sorted(set(arms)))
    records = [store.get(j, JobRecord) for j in jobs]  # decoded once for both steps
    gaps = _gaps(store, jobs, records, arms)
    if gaps and not allow_partial:
        raise PartialScore(gaps)
    d = _derive(store, records, n_boot, seed, SCORER_VERSION, arms)
    table = rows_table(d.rows)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    result = Result(
        task_set=d.task_set,
        set_build=d.set_build,
        jobs=tuple(jobs),
        answer_keys=d.answer_keys,
        scorer=SCORER,
        scorer_version=SCORER_VERSION,
        n_boot=n_boot,
        seed=seed,
        rows=d.rows,
        table=store.put_blob(sink.getvalue()),
        answer_columns=d.answer_columns,
        partial=any(r.partial for r in d.rows),
        arms=arms,
    )
    rid = store.put(result)
    if set_name is not None:
        ref = result_ref(set_name)
        if store.refs.get(ref) != rid:
            store.refs.update(ref, lambda _old: rid, message="score")
    return Scored(rid, result, table)


class _Codes:
    """A column of few distinct strings (a slot's status, runner, isolation) as integer
    codes, decoded once a job, so that each row group is counted by one `numpy.bincount`
    over its slice rather than by a pyarrow call of its own."""

    def __init__(self, values: pa.Array) -> None:
        if pa.types.is_null(values.type):
            values = values.cast(pa.string())
        if not pa.types.is_dictionary(values.type):
            values = pc.dictionary_encode(values)
        labels: list[str | None] = values.dictionary.to_pylist()
        self.labels = labels
        self.null = len(labels)  # the code of a null row
        indices = values.indices
        if values.null_count:
            indices = pc.fill_null(indices, self.null)
        self.codes = indices.to_numpy(zero_copy_only=False)

    def counts(self, start: int, stop: int) -> tuple[dict[str, int], int]:
        """The rows ``start:stop`` by value (those present), and how many are null."""
        counts = np.bincount(self.codes[start:stop], minlength=self.null + 1)
        by_value: dict[str, int] = {}
        nulls = int(counts[self.null])
        for label, c in zip(self.labels, counts[: self.null].tolist(), strict=True):
            if not c:
                continue
            if label is None:  # a null inside the dictionary is a null row too
                nulls += c
            else:
                by_value[label] = by_value.get(label, 0) + c
        return by_value, nulls


def _mixed(values: _Codes | None, start: int, stop: int, default: str) -> str:
    """The one value of rows ``start:stop`` (nulls aside), or "mixed: a, b" when there are
    more."""
    if values is None:
        return default
    seen = sorted(values.counts(start, stop)[0])
    if not seen:
        return default
    return seen[0] if len(seen) == 1 else "mixed: " + ", ".join(seen)


def _coverage(status: _Codes, start: int, stop: int) -> tuple[int, dict[str, int], int]:
    """A group's slots: answered, unanswered by outcome, never run."""
    counts, never = status.counts(start, stop)
    answered = counts.pop("answered", 0)
    return answered, dict(sorted(counts.items())), never


def _rows(
    answers: _Answers,
    preds: _Predictions,
    agent: str,
    arm: str,
    arm_variant: str,
    runner: str,
    n_boot: int,
    seed: int,
    legacy: bool,
) -> list[ScoreRow]:
    out = []
    status_codes = None if legacy else _Codes(preds.status)
    runner_codes = None if legacy or preds.runner is None else _Codes(preds.runner)
    isolation_codes = None if legacy or preds.isolation is None else _Codes(preds.isolation)
    for g in sorted(answers.record.groups, key=lambda g: (g.pair, g.target)):
        n = g.stop - g.start
        if g.numeric:
            truth, pred = answers.truth_num, preds.value_num
        else:
            truth, pred = answers.truth_text, preds.value_text
        truth = truth.slice(g.start, n)
        pred = pa.nulls(n, truth.type) if pred is None else pred.slice(g.start, n)
        m = metric_score(g.metric, truth, pred, n_boot=n_boot, seed=seed)
        configs = {g.config.hex()}
        if preds.config is not None:
            configs |= {c for c in pc.unique(preds.config.slice(g.start, n)).to_pylist() if c}
        ordered = sorted(configs)
        attempts = 0
        if preds.attempt is not None:
            attempts = pc.sum(preds.attempt.slice(g.start, n)).as_py() or 0
        row = ScoreRow(
            agent=agent,
            arm=arm,
            arm_variant=arm_variant,
            pair=g.pair,
            target=g.target,
            metric=g.metric,
            value=m.value,
            ci_low=m.ci_low,
            ci_high=m.ci_high,
            n=m.n,
            n_missing=m.n_missing,
            config=ordered[0],
            config_flag=(
                f"runs of {len(ordered)} config hashes: " + ", ".join(c[:12] for c in ordered)
                if len(ordered) > 1
                else ""
            ),
            attempts=int(attempts),
        )
        if status_codes is not None:
            answered, unanswered, never = _coverage(status_codes, g.start, g.stop)
            ran = never < n
            runners = _mixed(runner_codes, g.start, g.stop, runner)
            isolation = _mixed(isolation_codes, g.start, g.stop, "")
            mixed = [f"runners {runners[7:]}"] if runners.startswith("mixed: ") else []
            if isolation.startswith("mixed: "):
                mixed.append(f"isolation {isolation[7:]}")
            row = msgspec.structs.replace(
                row,
                expected=n,
                answered=answered,
                unanswered=unanswered,
                never_run=never,
                partial=never > 0,
                runner=runners if ran else "",
                isolation=isolation if ran else "",
                run_flag="runs of " + " and ".join(mixed) if mixed else "",
            )
            if not ran:  # no run at all: no score, not a score of zero
                row = msgspec.structs.replace(
                    row, value=None, ci_low=None, ci_high=None, n=0, n_missing=n
                )
        out.append(row)
        scores = preds.scores
        if not g.numeric and scores is not None:
            scores = scores.slice(g.start, n)
            if scores.null_count < n:
                out.append(_auroc_row(truth, scores, n_boot, seed, out[-1]))
    return out


def _auroc_row(
    truth: pa.Array, scores: pa.Array, n_boot: int, seed: int, base: ScoreRow
) -> ScoreRow:
    """AUROC from the class probabilities agents gave (rows without them count as missing)."""
    given = [None if s is None else msgspec.json.decode(s) for s in scores.to_pylist()]
    labels = truth.to_pylist()
    classes = sorted({c for c in labels if c is not None} | {c for s in given if s for c in s})
    matrix = np.full((len(given), len(classes)), np.nan)
    for i, s in enumerate(given):
        if s:
            matrix[i] = [float(s.get(c, 0.0)) for c in classes]
    m = metric_score("auroc", truth, None, matrix, classes, n_boot=n_boot, seed=seed)
    return msgspec.structs.replace(
        base,
        metric="auroc",
        value=m.value,
        ci_low=m.ci_low,
        ci_high=m.ci_high,
        n=m.n,
        n_missing=m.n_missing,
    )


def _flag(rows: list[ScoreRow]) -> list[ScoreRow]:
    """Flag rows whose config hash differs from another row of the same pair and arm."""
    by: dict[tuple[str, str, str, str], set[str]] = {}
    for r in rows:
        by.setdefault((r.arm, r.arm_variant, r.pair, r.target), set()).add(r.config)
    out = []
    for r in rows:
        others = by[(r.arm, r.arm_variant, r.pair, r.target)] - {r.config}
        if others and not r.config_flag:
            flag = "config hash differs from other rows: " + ", ".join(
                c[:12] for c in sorted(others)
            )
            r = msgspec.structs.replace(r, config_flag=flag)
        out.append(r)
    return out


def _flag_runs(rows: list[ScoreRow]) -> list[ScoreRow]:
    """Flag rows whose runner or isolation differs from another row of the same pair and
    arm: their scores were not made under the same conditions."""
    by: dict[tuple[str, str, str, str], set[tuple[str, str]]] = {}
    for r in rows:
        if r.runner:  # rows that never ran have no conditions to compare
            by.setdefault((r.arm, r.arm_variant, r.pair, r.target), set()).add(
                (r.runner, r.isolation)
            )
    out = []
    for r in rows:
        others = by.get((r.arm, r.arm_variant, r.pair, r.target), set()) - {(r.runner, r.isolation)}
        if r.runner and others and not r.run_flag:
            shown = ", ".join(f"{ru} ({iso or 'isolation unknown'})" for ru, iso in sorted(others))
            r = msgspec.structs.replace(r, run_flag=f"other rows ran on {shown}")
        out.append(r)
    return out


def rows_table(rows: Sequence[ScoreRow]) -> pa.Table:
    """A result's rows as the table its Parquet blob holds (`SCORE_SCHEMA`)."""
    data = {f: [getattr(r, f) for r in rows] for f in SCORE_SCHEMA.names}
    return pa.table(data, schema=SCORE_SCHEMA)


def row_dicts(rows: Sequence[ScoreRow]) -> list[dict[str, object]]:
    """Score rows as plain dicts with every field, those at their defaults too (records
    leave them out of their bytes; a reader of results.json should not have to know them)."""
    return [msgspec.to_builtins(msgspec.structs.asdict(r)) for r in rows]


def write_results(scored: Scored, folder: Path) -> tuple[Path, Path]:
    """``results.json`` and ``results.parquet`` in ``folder`` (the result id in both)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "result": scored.result.hex(),
        "task_set": scored.record.task_set.hex(),
        "scorer": f"{scored.record.scorer} {scored.record.scorer_version}",
        "n_boot": scored.record.n_boot,
        "seed": scored.record.seed,
        "partial": scored.record.partial,
        "arms": list(scored.record.arms),
        "rows": row_dicts(scored.record.rows),
    }
    j = folder / "results.json"
    j.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    p = folder / "results.parquet"
    meta = {b"medomni.result": scored.result.hex().encode()}
    pq.write_table(scored.table.replace_schema_metadata(meta), p)
    return j, p
