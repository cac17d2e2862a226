"""Where runs and jobs are recorded: every `RunRecord`, `PredictionRecord` and `JobRecord`
is made here, and nowhere else.

* `judge_answer`: the harness's verdict on a trial's answer (JSON, the format check, the
  served model), which may turn a runner's "answered" into "malformed" or "agent-failed".
* `record_trial`: one trial as a run (answer, predictions, encoder call log, logs) and the
  slot's ref ``runs/slots/<slot>`` moved to it; returns the run's id and record. Given a
  `RunBatch`, its objects are added to the batch and no ref moves: the harness writes a
  batch of runs as one pack and records them in their chunk's table
  (`medomni_cas.bench.harness.chunkclaims`).
* `record_job`: a job's final runs as a `JobRecord` with its `PredictionColumns`, and its
  ref ``runs/jobs/<key>``; returns the job's id.

The harness (`medomni_cas.bench.harness`) calls them as trials end and jobs finish; runners
never write to the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import SupportsFloat, cast

import msgspec

from medomni_cas.bench.columns import ArmRows, prediction_columns
from medomni_cas.bench.encoder_calls import meets_arm
from medomni_cas.bench.records import (
    AgentBlock,
    AgentConfig,
    EncoderServed,
    JobRecord,
    Outcome,
    PredictionRecord,
    RunRecord,
)
from medomni_cas.bench.refnames import job_ref, slot_ref
from medomni_cas.bench.runners import Job, Trial, TrialSpec
from medomni_cas.bench.secrets import redactor
from medomni_cas.store import encoding
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import TREE
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.objects import CHUNK_SIZE, Tree
from medomni_cas.store.store import Store
from medomni_cas.studio.records import SCORES_KEY

__all__ = ["RunBatch", "judge_answer", "record_job", "record_trial"]


def judge_answer(
    spec: TrialSpec, trial: Trial, agent: AgentConfig
) -> tuple[Outcome, dict[str, object], list[str]]:
    """The run's outcome, the answer's values by target (empty unless it stands) and every
    error: the runner's, then the answer's.

    Only an "answered" trial is judged: an answer that is not JSON or fails the format check
    is "malformed"; one from another model than the config's served model is "agent-failed".
    An answer (well-formed or not) that went past a limit of the agent's config (tokens,
    cost, time) is "over-limit", and does not stand.
    """
    outcome, values, errors = _judge(spec, trial, agent)
    if outcome in ("answered", "malformed"):
        over = _over_limits(trial, agent)
        if over:
            return "over-limit", {}, errors + over
    return outcome, values, errors


def _judge(
    spec: TrialSpec, trial: Trial, agent: AgentConfig
) -> tuple[Outcome, dict[str, object], list[str]]:
    errors = list(trial.errors)
    if trial.outcome != "answered":
        return trial.outcome, {}, errors
    outcome: Outcome = "answered"
    values: dict[str, object] = {}
    try:
        parsed = msgspec.json.decode(trial.answer or b"")
    except msgspec.DecodeError as e:
        parsed, problems = None, [f"the answer is not JSON: {e}"]
    else:
        problems = spec.format_check.problems(parsed)
    if problems:
        outcome = "malformed"
        errors += problems
    else:
        values = parsed
    if agent.served_model and trial.served_model != agent.served_model:
        outcome = "agent-failed"
        errors.append(
            f"served model {trial.served_model!r} is not the config's {agent.served_model!r}"
        )
        values = {}
    return outcome, values, errors


def _over_limits(trial: Trial, agent: AgentConfig) -> list[str]:
    """Each limit of ``agent``'s config that ``trial`` went past, as an error."""
    limits, over = agent.limits, []
    if (
        limits.tokens is not None
        and (trial.tokens_in or 0) + (trial.tokens_out or 0) > limits.tokens
    ):
        used = (trial.tokens_in or 0) + (trial.tokens_out or 0)
        over.append(f"over the token limit: {used} tokens, the limit is {limits.tokens}")
    if limits.cost_usd is not None and (trial.cost_usd or 0.0) > limits.cost_usd:
        over.append(f"over the cost limit: ${trial.cost_usd:g}, the limit is ${limits.cost_usd:g}")
    if limits.time_sec is not None and trial.elapsed_ms > limits.time_sec * 1000:
        took = trial.elapsed_ms / 1000
        over.append(f"over the time limit: {took:.1f} s, the limit is {limits.time_sec} s")
    return over


def _value(kind: str, value: object) -> str | float:
    return cast(str, value) if kind == "class" else float(cast(SupportsFloat, value))


def _predictions(
    run_id: str, spec: TrialSpec, values: Mapping[str, object], intelligence: str
) -> list[PredictionRecord]:
    """One record per target the answer gives. The values passed the format check: a class
    target's is a label, any other's a number, and the scores map classes to numbers."""
    scores = cast("Mapping[str, Mapping[str, float]]", values.get(SCORES_KEY, {}))
    return [
        PredictionRecord(
            run_id=run_id,
            atom=spec.atom_id,
            target=t.name,
            value=_value(t.kind, values[t.name]),
            intelligence=intelligence,
            scores={c: float(p) for c, p in scores.get(t.name, {}).items()},
        )
        for t in spec.format_check.targets
        if t.name in values
    ]


class RunBatch:
    """The objects of runs not written yet, to be put in one `Store.put_raw_many` (which
    writes children first): on a remote store a batch of runs costs a pack, not requests
    per run."""

    def __init__(self) -> None:
        self.items: dict[ObjectId, bytes] = {}

    def add(self, data: bytes) -> ObjectId:
        oid = hash_bytes(data)
        self.items[oid] = data
        return oid

    def write(self, store: Store) -> list[tuple[ObjectId, bytes]]:
        """Put the batch's objects in ``store``, empty it; the objects written."""
        items = list(self.items.items())
        if items:
            store.put_raw_many(items)
        self.items.clear()
        return items


class _Leaves:
    """Objects that link nothing new (blobs, prediction records), put in one batch."""

    def __init__(self, store: Store, batch: RunBatch | None = None) -> None:
        self.store = store
        self.batch = batch
        self.items: list[tuple[ObjectId, bytes]] = []

    def blob(self, data: bytes) -> ObjectId:
        if len(data) > CHUNK_SIZE:
            return self.store.put_blob(data)  # chunked: its chunks are written first
        oid, raw = blob_object(data)
        self.items.append((oid, raw))
        return oid

    def records(self, records: Sequence[PredictionRecord]) -> list[ObjectId]:
        out = []
        for r in records:
            raw = encoding.encode(r)
            oid = hash_bytes(raw)
            self.items.append((oid, raw))
            out.append(oid)
        return out

    def write(self) -> None:
        if self.batch is not None:
            self.batch.items.update(self.items)
        elif self.items:
            self.store.put_raw_many(dict(self.items).items())


def record_trial(
    store: Store,
    job: Job,
    spec: TrialSpec,
    trial: Trial,
    task_set: ObjectId,
    previous: ObjectId | None,
    batch: RunBatch | None = None,
) -> tuple[ObjectId, RunRecord]:
    """Record ``trial``, the run of ``spec``'s slot after run ``previous`` (None for its
    first), and move the slot's ref to it; the run's id and record. The agent config's
    secrets are redacted from the trial first (`medomni_cas.bench.secrets`), in place.
    With ``batch`` the run's objects are added to it (not written) and no ref moves."""
    redactor(job.agent).trial(trial)
    outcome, values, errors = judge_answer(spec, trial, job.agent)
    run_id = f"{spec.slot.hex()}-{trial.attempt}"
    calls = trial.encoder_calls
    # the run's leaves (answer, predictions, call log, log files) as one batch: on a remote
    # store one pack, not a request each; then the log tree, then the record that links all
    leaves = _Leaves(store, batch)
    answer_id = leaves.blob(trial.answer) if trial.answer is not None else None
    pred_ids = leaves.records(_predictions(run_id, spec, values, job.agent.kind))
    log_id = None
    if calls:
        log_id = leaves.blob(b"".join(msgspec.json.encode(c) + b"\n" for c in calls))
    log_files = {n: leaves.blob(b) for n, b in sorted(trial.logs.items())}
    leaves.write()
    ok, why = (True, "")
    if job.encoders != "none" or calls:
        ok, why = meets_arm(job.encoders, calls)
    if not log_files:
        logs = None
    elif batch is None:
        logs = store.put_tree(log_files)
    else:  # its entries are in the batch: written before it (children first)
        logs = batch.add(encoding.encode_object(TREE, 1, dict(Tree(log_files).items())))
    record = RunRecord(
        run_id=run_id,
        slot=spec.slot.hex(),
        attempt=trial.attempt,
        previous=previous,
        intelligence=job.agent.kind,
        agent_config=job.agent_id,
        task_set=task_set,
        atom=spec.atom_id,
        pair=spec.atom.pair,
        task_version=spec.atom.version,
        config=spec.atom.config,
        repetition=job.repetition,
        runner=job.runner,
        outcome=outcome,
        environment=trial.environment,
        isolation=trial.isolation,
        served_model=trial.served_model,
        cost_usd=trial.cost_usd,
        tokens_in=trial.tokens_in,
        tokens_out=trial.tokens_out,
        errors=tuple(errors),
        started=trial.started,
        finished=trial.finished,
        elapsed_ms=trial.elapsed_ms,
        agent_block=AgentBlock(
            arm=job.arm,
            arm_variant=job.arm_variant,
            encoders=job.encoders,
            encoders_served=tuple(
                EncoderServed(name=e.name, version=e.version, digest=e.digest)
                for e in trial.encoders_served
            ),
            encoder_calls=sum(1 for c in calls if c.status == "ok"),
            encoder_log=log_id,
            meets_arm=ok,
            meets_arm_reason=why,
            files_opened=tuple(trial.files_opened),
        ),
        answer=answer_id,
        logs=logs,
        predictions=tuple(pred_ids),
    )
    if batch is not None:
        return batch.add(encoding.encode(record)), record
    rid = store.put(record)
    store.refs.set(
        slot_ref(spec.slot), rid, expected=previous, message=f"{outcome} attempt {trial.attempt}"
    )
    return rid, record


def record_job(
    store: Store,
    job: Job,
    runs: Sequence[ObjectId],
    *,
    task_set: ObjectId,
    set_build: ObjectId,
    rows: ArmRows,
    started: str,
    known: Mapping[ObjectId, RunRecord] | None = None,
) -> ObjectId:
    """Record ``job`` over ``runs``, the final run of each of its slots in the arm's atom
    order, with its predictions as columns in ``rows``' order; move the job's ref to it.
    The job's id (the same when nothing ran since the last record)."""
    known = known or {}
    read = dict(store.get_many([r for r in runs if r not in known], RunRecord))
    records = [known[r] if r in known else read[r] for r in runs]
    table = store.put(prediction_columns(store, rows, records, job.agent.kind))
    record = JobRecord(
        name=job.name,
        task_set=task_set,
        set_build=set_build,
        agent_config=job.agent_id,
        arm=job.arm,
        arm_variant=job.arm_variant,
        repetition=job.repetition,
        runner=job.runner,
        runs=tuple(runs),
        attempts=sum(r.attempt for r in records),
        predictions=table,
        started=started,
    )
    jid = store.put(record)
    ref = job_ref(task_set, job.agent_id, job.arm_label, job.repetition)
    if store.refs.get(ref) != jid:
        store.refs.update(ref, lambda _cur: jid, message=f"job {job.name}")
    return jid
