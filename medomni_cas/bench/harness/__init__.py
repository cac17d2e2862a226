"""The harness: ``medomni bench run <benchmark>/<set> --agent <config>``.

1. Checks the whole set and runs nothing if any check fails (`harness.checks`): the built
   tasks, stand-in agents on each task, the agent's route against each dataset's policy,
   and what the runner needs (its own `Runner.check`: the agent command, the perception
   service, an image).
2. Runs one job per arm (and rung) x repetition, slot by slot. A run slot's id is
   ``hash(atom, agent config, arm label, repetition)``; ``runs/slots/<slot>`` points at its
   latest run (in stores written before chunks), and ``runs/chunks/<chunk>`` the latest run
   of each slot of a chunk of the job (`medomni_cas.bench.slottables`) with its state, so
   resuming is a batch of ref and table reads, no run read. A chunk of slots is claimed
   before its slots run, under a lease its harness keeps alive with a heartbeat
   (`harness.claims`), so two harnesses on one store never run a slot twice, and the
   chunks of a harness that died are taken over once its lease lapses; runs are recorded
   in batches (`harness.chunkclaims`).
3. Records each trial as it ends and each job as it finishes (`medomni_cas.bench.recording`),
   then writes the run folder as a view, and the call's `JobReport` in it (``report.json``);
   files a runner kept there have the agent config's secrets redacted
   (`medomni_cas.bench.secrets`).

SIGINT and SIGTERM stop it (`harness.interrupts`): it ends the trial in flight, starts no
other, releases its claims, records the job with the runs that finished, and raises
`Interrupted` (the CLI exits 130 / 143). So does a lease it could not renew (`LeaseLost`).

A slot is done when its run ended with an outcome of the agent's own. A run that failed for
the infrastructure is kept, and the slot runs again on resume, up to ``max_attempts``. The
refs it reads and moves are listed in `medomni_cas.bench.refnames`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, NamedTuple, get_args

import msgspec

from medomni_cas._gcpause import gc_paused
from medomni_cas.bench.columns import PREDICTION_COLUMNS, ArmRows, arm_rows
from medomni_cas.bench.evidence import keep_evidence
from medomni_cas.bench.harness import interrupts
from medomni_cas.bench.harness.checks import (
    CheckFailed,
    check_built,
    check_card,
    check_posix_permissions,
    check_routes,
)
from medomni_cas.bench.harness.chunkclaims import Committed, JobClaims
from medomni_cas.bench.harness.claims import DEFAULT_LEASE, Holder, Lease, LeaseLost
from medomni_cas.bench.harness.interrupts import Interrupted
from medomni_cas.bench.recording import record_job, record_trial
from medomni_cas.bench.records import (
    AGENT_OUTCOMES,
    ENCODERS_UNMET,
    OUTCOMES,
    AgentConfig,
    JobRecord,
    RunRecord,
    slot_digests,
)
from medomni_cas.bench.refnames import agent_ref, job_name_ref, job_ref
from medomni_cas.bench.runfolders import write_run_folder
from medomni_cas.bench.runners import Job, Runner, Trial, TrialSpec, get_runner
from medomni_cas.bench.scratch import SCRATCH_FOLDER
from medomni_cas.bench.secrets import redactor
from medomni_cas.bench.slottables import chunk_ids, latest_runs, latest_states, state_of
from medomni_cas.bench.stagecache import prefetch, remember, staging_store
from medomni_cas.bench.trialpool import default_concurrency
from medomni_cas.errors import InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.files import atomic_write
from medomni_cas.store.ids import ObjectId, id_from_digest
from medomni_cas.store.store import Store
from medomni_cas.store.url import LOCAL_SCHEMES
from medomni_cas.studio.arms import arm_builds, arm_label
from medomni_cas.studio.records import AtomTask, FormatCheck, SetEntry
from medomni_cas.studio.tasksets import SetView, show_set

__all__ = [
    "PREDICTION_COLUMNS",
    "RERUNS",
    "CheckFailed",
    "Holder",
    "Interrupted",
    "JobReport",
    "LeaseLost",
    "Rerun",
    "Resume",
    "RunReport",
    "RunState",
    "check_posix_permissions",
    "report_json",
    "resume",
    "job_ref",
    "run_set",
    "run_states",
]

_HELD_POLL = 1.0  # seconds between looks at the slots other harnesses hold
Progress = Callable[[str, int, int], None]  # (job name, slots done, slots in the job)


#: What ``--rerun`` runs again: a new attempt of each chosen slot, linked from its last.
Rerun = Literal["infra", "failed", "unanswered", "all"]
RERUNS: tuple[Rerun, ...] = get_args(Rerun)
#: The final outcomes each ``--rerun`` choice runs again ("unanswered" also takes an answer
#: that does not meet its arm, and "all" every slot with a run).
_RERUN_OUTCOMES: dict[str, frozenset[str]] = {
    "infra": frozenset({"infra-error"}),
    "failed": frozenset({"infra-error", "agent-failed", "timeout"}),
    "unanswered": frozenset(OUTCOMES) - {"answered"},
    "all": frozenset(OUTCOMES),
}


@dataclass
class JobReport:
    """One job of a `run_set` call: what it was asked to run and where each slot stands.

    Every slot of the job is counted once: ``outside_shard``, or in scope; a slot in scope
    ran now (``ran``), was ``done`` before (a final run this call did not redo), is ``held``
    by another live harness, or was never run (the job stopped early, or gave up on an
    infrastructure error). ``outcomes`` counts the final runs in scope by outcome, after
    this call; ``unanswered`` those without a scored answer (any outcome but "answered",
    and answers that do not meet the arm).
    """

    name: str
    job: ObjectId
    folder: Path
    slots: int
    ran: int
    done: int = 0
    held: list[str] = field(default_factory=list)  # "<host> pid <pid>" of each held slot
    outside_shard: int = 0
    never_run: int = 0
    unanswered: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    infra_errors: int = 0  # runs of this call that ended in an infrastructure error
    stopped: str = ""  # why the job stopped early (``fail_fast``), else ""

    @property
    def skipped(self) -> int:
        """Slots in scope not run by this call because they were done before."""
        return self.done

    @property
    def complete(self) -> bool:
        """Every slot in scope has a final run with a scored answer."""
        return not (self.unanswered or self.never_run or self.held or self.stopped)


@dataclass
class RunReport:
    task_set: ObjectId
    agent_config: ObjectId
    jobs: list[JobReport] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return sum(j.ran for j in self.jobs)

    @property
    def complete(self) -> bool:
        """Every slot asked for has a final run with a scored answer: `bench run` exits 0."""
        return all(j.complete for j in self.jobs)


@dataclass
class _Planned:
    """A job as planned: its slots to run, and what recording it needs."""

    job: Job
    previous: dict[ObjectId, ObjectId | None]  # slot to run -> its latest run
    plan: Resume
    rows: ArmRows


# -- resume -----------------------------------------------------------------------------------
class _BlockState(msgspec.Struct):
    meets_arm: bool = True


class _RunState(encoding.View):
    """What resume reads of a run record; the other fields are skipped undecoded."""

    __kind__ = RunRecord.__kind__
    __version__ = RunRecord.__version__

    outcome: str
    attempt: int
    agent_block: _BlockState


class RunState(NamedTuple):
    """A run as resume and the job report see it."""

    outcome: str
    attempt: int
    meets_arm: bool

    @property
    def answered(self) -> bool:
        """The run gave an answer the scorer counts."""
        return self.outcome == "answered" and self.meets_arm

    @property
    def status(self) -> str:
        """ "answered", the outcome, or `ENCODERS_UNMET` for an answer off its arm."""
        if self.outcome == "answered" and not self.meets_arm:
            return ENCODERS_UNMET
        return self.outcome


def run_states(store: Store, runs: list[ObjectId]) -> dict[ObjectId, RunState]:
    """Each run's outcome, attempt and whether it met its arm, read from its verified
    bytes: all resume and the report need."""
    out = {}
    for rid, data in store.get_raw_many(runs):  # verified bytes (never None: no allow_missing)
        try:
            state = encoding.decode_view(data, _RunState)
        except InvalidObject as e:
            raise MedomniError(f"run slot points at {rid}: {e}") from None
        out[rid] = RunState(state.outcome, state.attempt, state.agent_block.meets_arm)
    return out


def _rerun_chosen(state: RunState, rerun: Rerun) -> bool:
    """Whether ``--rerun`` chose a slot whose final run is ``state``."""
    return state.outcome in _RERUN_OUTCOMES[rerun] or (
        rerun in ("unanswered", "all") and not state.answered
    )


@dataclass
class Resume:
    """Where a job's slots stand before it runs: the resume check's answer."""

    slots: list[bytes]  # every slot of the job (digests), in the arm's atom order
    to_run: list[tuple[int, int, ObjectId | None]]  # (atom index, attempt, latest run)
    scope: int = 0  # slots this call is asked for (its shard's)
    done: int = 0  # slots in scope with a final run this call does not redo
    outcomes: dict[str, int] = field(default_factory=dict)  # of those final runs
    unanswered: int = 0  # of those final runs, those without a scored answer


@gc_paused  # the tables' ids and states, 100,000 of them kept (`medomni_cas._gcpause`)
def resume(
    store: Store,
    atoms: Sequence[ObjectId],
    agent_config: ObjectId,
    arm_label: str,
    repetition: int,
    *,
    shard: tuple[int, int] | None = None,
    rerun: Rerun | None = None,
    max_attempts: int = 3,
) -> Resume:
    """The resume check of one job: every slot's id, one batch of ref reads, then each
    final run's outcome, attempt and arm check, as its chunk's table holds them (or, for a
    table without states, a view of the run's verified bytes); counts what is done. The
    loop is the hot path of resuming 100,000 slots: it stays flat."""
    slots = slot_digests(atoms, agent_config, arm_label, repetition)
    lasts, known = latest_states(store, slots)
    plan = Resume(slots, [])
    to_run = plan.to_run.append
    if shard is not None:
        n, k = shard[1], shard[0]
        scope = [
            (i, last)
            for i, (digest, last) in enumerate(zip(slots, lasts, strict=True))
            if int.from_bytes(digest[:8], "big") % n == k
        ]
    else:
        scope = list(enumerate(lasts))
    plan.scope = len(scope)
    # the runs whose tables hold no state (written before states were kept), in one pass
    unknown = [last for _, last in scope if last is not None and last not in known]
    if unknown:
        known.update(run_states(store, unknown))
    final = AGENT_OUTCOMES
    done: list[str] = []
    keep = done.append
    unmet = 0
    for i, last in scope:
        if last is None:
            to_run((i, 1, None))
            continue
        outcome, attempt, meets_arm = known[last]
        if rerun is None:
            redo = outcome not in final and attempt < max_attempts
        else:
            redo = _rerun_chosen(RunState(outcome, attempt, meets_arm), rerun)
        if redo:
            to_run((i, attempt + 1, last))
            continue
        keep(outcome)
        if outcome == "answered" and not meets_arm:
            unmet += 1
    outcomes = Counter(done)
    plan.done = len(done)
    plan.outcomes = dict(sorted(outcomes.items()))
    plan.unanswered = len(done) - outcomes.get("answered", 0) + unmet
    return plan


# -- planning ---------------------------------------------------------------------------------
def _entries(view: SetView, arms: Sequence[str] | None) -> list[SetEntry]:
    if arms:
        have = {e.arm for e in view.entries}
        unknown = [a for a in arms if a not in have]
        if unknown:
            raise MedomniError(
                f"task set {view.name} has no arm {unknown[0]!r} (has: {', '.join(sorted(have))})"
            )
        return [e for e in view.entries if e.arm in arms]
    return list(view.entries)


@interrupts.stop_on_signals()
def run_set(
    store: Store,
    name: str,
    agent: AgentConfig,
    *,
    runs_dir: Path,
    studio: Path | None,
    bench: Path | None = None,
    runner: str | Runner = "process",
    arms: Sequence[str] | None = None,
    reps: int = 1,
    accept_conditions: bool = False,
    max_attempts: int = 3,
    budget: int = 8,
    claim_timeout: float = DEFAULT_LEASE,
    progress: Progress | None = None,
    shard: tuple[int, int] | None = None,
    rerun: Rerun | None = None,
    fail_fast: int = 5,
    concurrency: int | None = None,
) -> RunReport:
    """Check the set, then run what has not run yet; see the module docstring.

    ``shard=(i, n)`` runs only the slots whose id falls in shard i of n, so machines can
    share a set on one store; each writes its jobs' records, and a last unsharded run (which
    finds every slot done) records every job whole.

    ``rerun`` runs a new attempt of the chosen slots even when their final run is the
    agent's own outcome: "infra" (infrastructure errors, past ``max_attempts`` too),
    "failed" (also agent-failed and timeout), "unanswered" (every run without a scored
    answer) or "all". ``fail_fast=K`` stops a job whose first K runs of this call all ended
    without an answer with the same error (0: never).

    ``concurrency`` is how many trials the runner may run at once (default: the cores this
    process may use); the process runner keeps that many agents running, each isolated as
    when they run one by one. It changes no record but the runs' times.

    ``claim_timeout`` is this harness's lease in seconds: how long other harnesses wait for
    its heartbeat before they take its slots over. Raises `Interrupted` on SIGINT / SIGTERM
    and `LeaseLost` when the lease could not be kept, each with ``report`` (what was
    recorded) set.
    """
    if reps < 1:
        raise MedomniError(f"--reps must be at least 1, got {reps}")
    if rerun is not None and rerun not in RERUNS:
        raise MedomniError(f"--rerun {rerun!r}: want one of {', '.join(RERUNS)}")
    if fail_fast < 0:
        raise MedomniError(f"--fail-fast must be 0 (off) or more, got {fail_fast}")
    if max_attempts < 1:
        raise MedomniError(f"--max-attempts must be at least 1, got {max_attempts}")
    if not claim_timeout > 0:
        raise MedomniError(
            f"--claim-timeout wants a positive number of seconds, got {claim_timeout}"
        )
    if concurrency is None:
        concurrency = default_concurrency()
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise MedomniError(f"--concurrency must be at least 1 trial at once, got {concurrency}")
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise MedomniError(f"shard {shard[0]}/{shard[1]}: want i/n with 0 <= i < n")
    view = show_set(store, name)
    if not view.entries or view.build is None:
        raise MedomniError(f"task set {name} has no build; run `medomni studio taskset build`")
    entries = _entries(view, arms)
    impl = get_runner(runner) if isinstance(runner, str) else runner
    check_posix_permissions(runs_dir)
    agent_id = store.put(agent)
    problems: list[str] = []
    notices: list[str] = []
    built = check_built(store, entries, problems)
    check_routes(store, entries, agent, studio, accept_conditions, problems, notices)
    check_card(name, agent, bench, problems, notices)
    if problems:  # damaged tasks cannot even be planned; report before reading them again
        raise CheckFailed(sorted(dict.fromkeys(problems)))

    builds = arm_builds(view.record.builder)
    # one job per arm (and rung) x repetition, over every pair of the set
    groups: dict[tuple[str, str], list[SetEntry]] = {}
    for e in entries:
        groups.setdefault((e.arm, e.arm_variant), []).append(e)
    planned: list[_Planned] = []
    checks: dict[ObjectId, FormatCheck] = {}
    for (arm, variant), group in groups.items():
        encoders = builds[arm].encoders if arm in builds else "none"
        label = arm_label(arm, variant)
        atoms: list[tuple[ObjectId, AtomTask]] = []
        for e in group:
            atoms += built[e.result]
        rows = arm_rows(store, view.build, arm, variant)
        for rep in range(1, reps + 1):
            job = Job(
                name="",
                folder=runs_dir,
                store=store,
                agent=agent,
                agent_id=agent_id,
                arm=arm,
                arm_variant=variant,
                encoders=encoders,
                repetition=rep,
                budget=budget,
                runner=impl.name,
                scratch=runs_dir / SCRATCH_FOLDER,
                private=tuple(p for p in (studio, runs_dir) if p is not None),
                concurrency=concurrency,
                atoms=tuple(aid for aid, _ in atoms),
            )
            plan = resume(
                store,
                [aid for aid, _ in atoms],
                agent_id,
                label,
                rep,
                shard=shard,
                rerun=rerun,
                max_attempts=max_attempts,
            )
            previous: dict[ObjectId, ObjectId | None] = {}
            for i, attempt, last in plan.to_run:
                aid, atom = atoms[i]
                check = checks.get(atom.format_check)
                if check is None:
                    check = checks[atom.format_check] = store.get(atom.format_check, FormatCheck)
                slot = id_from_digest(plan.slots[i])  # only a slot that runs needs its id
                job.trials.append(TrialSpec(slot, attempt, aid, atom, check))
                previous[slot] = last
            planned.append(_Planned(job, previous, plan, rows))
            if job.trials:
                problems += [f"{label} r{rep}: {p}" for p in impl.check(job)]
    if problems:
        raise CheckFailed(sorted(dict.fromkeys(problems)))

    # the comparer's pairing reads each atom's evidence id: keep them now, from the atoms
    # just verified and decoded, rather than have the first compare decode every atom again
    keep_evidence(store, {r: [a for _, a in atoms] for r, atoms in built.items()})
    report = RunReport(view.task_set, agent_id, notices=notices)
    if store.refs.get(agent_ref(agent.name)) != agent_id:
        # harnesses of one set may start together: retry, the last config named wins
        store.refs.update(agent_ref(agent.name), lambda _cur: agent_id, message="bench run")
    try:
        # a signal waits for a check (between claims, before a trial) or the runner (which
        # it interrupts): a run is recorded whole or not at all, and each job with what ran
        with (
            interrupts.protected(),
            staging_store(store, runs_dir) as stage,
            Lease(store, claim_timeout) as lease,
        ):
            for p in planned:
                p.job.store = stage  # what runners read; the harness writes to ``store``
                interrupts.check()
                report.jobs.append(
                    _run_job(store, view, impl, p, runs_dir, lease, progress, fail_fast)
                )
    except (Interrupted, LeaseLost) as e:
        if e.job is not None and e.job not in report.jobs:
            report.jobs.append(e.job)
        e.report = report
        raise
    return report


# -- running ----------------------------------------------------------------------------------
def _folder_name(set_name: str, agent: str, arm_label: str, rep: int, stamp: str) -> str:
    return f"{set_name.replace('/', '.')}--{agent}--{arm_label}--r{rep}--{stamp}"


def _job_started(store: Store, view: SetView, job: Job) -> tuple[str, str]:
    """The job's start time and run folder name: its record's, else those kept from its
    first start (`runs/job-names/<key>`), so a job killed before its record was written
    resumes in the same run folder, where a runner may keep files of its own (the Harbor
    runner's job folders)."""
    key = (view.task_set, job.agent_id, job.arm_label, job.repetition)
    old_job = store.refs.get(job_ref(*key))
    if old_job is not None:
        old = store.get(old_job, JobRecord)
        return old.started, old.name
    name_ref = job_name_ref(*key)
    pending = store.refs.get(name_ref)
    if pending is None:
        started = datetime.now(UTC).isoformat(timespec="milliseconds")
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        name = _folder_name(view.name, job.agent.name, job.arm_label, job.repetition, stamp)
        mine = store.put_blob(f"{started}\n{name}".encode())
        if store.refs.add_if_new(name_ref, mine, "job started"):
            return started, name
        pending = store.refs[name_ref]  # another harness started it first
    started, name = store.read_blob(pending).decode().split("\n", 1)
    return started, name


def _error_of(record: RunRecord, trial: Trial) -> str:
    """A run's failure as fail-fast compares it: its outcome and first error, with the last
    line the agent wrote to stderr (where a broken install says what is missing)."""
    why = record.errors[0] if record.errors else record.agent_block.meets_arm_reason
    text = f"{record.outcome}: {why}" if why else record.outcome
    tail = trial.logs.get("stderr.txt", b"").decode(errors="replace").strip().splitlines()
    return f"{text} (stderr: {tail[-1].strip()[:300]})" if tail else text


def _run_job(
    store: Store,
    view: SetView,
    impl: Runner,
    planned: _Planned,
    runs_dir: Path,
    lease: Lease,
    progress: Progress | None,
    fail_fast: int,
) -> JobReport:
    job, slots = planned.job, planned.plan.slots
    started, job.name = _job_started(store, view, job)
    job.folder = runs_dir / job.name
    ran = infra = 0
    stopped = ""
    halted: Interrupted | LeaseLost | None = None
    failed = False  # an error other than those is on its way out
    # the errors of this call's first runs, until one answers or fail_fast of them are in
    failures: list[str] = []
    watching = fail_fast > 0
    chunks = chunk_ids(slots)
    running: set[bytes] = {bytes(t.slot) for t in job.trials}
    running |= {c for s, c in zip(slots, chunks, strict=True) if s in running}
    lease.sweep([*slots, *chunks], running)  # per-slot claims: harnesses before chunks
    local = store.url.startswith((*LOCAL_SCHEMES, "memory://"))
    claims = JobClaims(store, lease, slots, planned.previous, batched=not local)
    by_chunk: dict[bytes, list[TrialSpec]] = {}
    for t in job.trials:
        by_chunk.setdefault(claims.chunk_of[t.slot], []).append(t)
    # the runner stages a chunk's tasks from a local copy, read in a few batches
    claims.on_claim = lambda chunk: prefetch(job.store, by_chunk.get(chunk, []))
    claims.on_write = lambda items: remember(job.store, items)
    recorded: dict[bytes, ObjectId] = {}  # slot -> the run this call recorded
    records: dict[ObjectId, RunRecord] = {}
    todo, total = job.trials, len(job.trials)

    def done(committed: list[Committed]) -> None:
        nonlocal ran, infra
        for slot, rid, record in committed:
            recorded[slot] = rid
            records[rid] = record
            ran += 1
            infra += record.outcome == "infra-error"
            if progress is not None:
                progress(job.name, ran, total)

    try:
        while todo and not stopped:
            if impl.claims_each:
                # the runner claims each slot as it starts it: harnesses share the job
                job.trials, job.claim = todo, claims.claim
            else:
                # claim every slot first: another harness on this store skips what we hold
                job.trials = claims.claim_all(todo, interrupts.check)
            if job.trials:
                job.folder.mkdir(parents=True, exist_ok=True)
                with interrupts.interruptible():  # a runner never writes to the store
                    impl.prepare(job)
            for stream in (impl.run(job), impl.collect(job)) if job.trials else ():
                for trial in interrupts.each(stream, lease.check):
                    spec = claims.specs.get(trial.slot)
                    if spec is None:
                        continue  # a runner reporting a slot twice, or one not ours
                    previous = planned.previous[trial.slot]
                    rid, record = record_trial(
                        store, job, spec, trial, view.task_set, previous, claims.batch
                    )
                    claims.add(spec, rid, record)
                    if claims.due():
                        done(claims.flush())
                    if watching:
                        if record.outcome == "answered" and record.agent_block.meets_arm:
                            watching = False  # it answers: no early stop for this job
                        else:
                            failures.append(_error_of(record, trial))
                            watching = len(failures) < fail_fast
                            if len(failures) == fail_fast and len(set(failures)) == 1:
                                stopped = failures[0]
                                break
                if stopped:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()  # the runner's clean-up: its trials in flight end
                    break
            done(claims.close())  # recorded, and every chunk released, before any wait
            # slots other harnesses held: a runner that claims each slot waits for them, and
            # runs those whose holder died; the others report them held, as before
            todo = []
            if impl.claims_each and claims.waiting and not stopped:
                with interrupts.interruptible():
                    time.sleep(min(_HELD_POLL, lease.timeout / 3))
                lease.check()
                todo = claims.retry()
    except (Interrupted, LeaseLost) as e:
        halted = e  # record what finished, then stop
    except BaseException:
        failed = True
        raise
    finally:
        job.claim = None
        _close(claims, done, quiet=failed)  # what finished is recorded; the slots not run are free
    held = claims.holders()
    held_slots: set[bytes] = set(claims.waiting)
    # the latest run of each slot: those this call recorded, the others' read once
    known = [recorded.get(s) for s in slots]
    if None in known:
        read = latest_runs(store, slots)
        known = [recorded.get(s, last) for s, last in zip(slots, read, strict=True)]
    latest = dict(zip(slots, known, strict=True))
    runs = [rid for rid in known if rid is not None]
    assert view.build is not None  # run_set refuses a set without one
    jid = record_job(
        store,
        job,
        runs,
        task_set=view.task_set,
        set_build=view.build,
        rows=planned.rows,
        started=started,
        known=records,
    )
    report = JobReport(
        job.name,
        jid,
        job.folder,
        len(slots),
        ran,
        done=planned.plan.done,
        held=held,
        outside_shard=len(slots) - planned.plan.scope,
        infra_errors=infra,
        stopped=stopped,
    )
    _count(store, planned, report, held_slots, latest, records)
    if runs:
        write_run_folder(job.store, jid, job.folder)  # through the staging cache
    if job.folder.is_dir():
        # what a runner keeps there of its own (Harbor's trial folders) holds no secret either
        redact = redactor(job.agent)
        if redact.values:
            redact.folder(job.folder)
        atomic_write(job.folder / "report.json", report_json(report), durable=False)
    if halted is not None:
        halted.job = report
        raise halted
    return report


def _close(claims: JobClaims, done: Callable[[list[Committed]], None], *, quiet: bool) -> None:
    """`JobClaims.close` on the way out; with ``quiet`` (another error is on its way out,
    the store gone, say) an error it raises does not hide that one."""
    try:
        done(claims.close())
    except Exception:
        if not quiet:
            raise


def report_json(report: JobReport) -> bytes:
    """A job's report as ``report.json`` in its run folder and ``bench run --json`` hold it."""
    doc = dict(vars(report))
    doc["job"] = report.job.hex()
    doc["folder"] = str(report.folder)
    doc["complete"] = report.complete
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def _count(
    store: Store,
    planned: _Planned,
    report: JobReport,
    held: set[bytes],
    latest: Mapping[bytes, ObjectId | None],
    records: Mapping[ObjectId, RunRecord] | None = None,
) -> None:
    """Fill in where the slots in scope stand now: those done before as the resume check
    found them, those planned to run as ``latest`` (each slot's latest run) says after the
    run (but those another harness held, which the report counts as held)."""
    outcomes = dict(planned.plan.outcomes)
    report.unanswered = planned.plan.unanswered
    slots = [planned.plan.slots[i] for i, _, _ in planned.plan.to_run]
    slots = [s for s in slots if s not in held]
    records = records or {}
    lasts = [latest[s] for s in slots]
    # the runs this call recorded are known; only the others' are read
    states = run_states(store, [r for r in lasts if r is not None and r not in records])
    for rid, r in records.items():
        states[rid] = RunState(*state_of(r))
    for last in lasts:
        if last is None:
            report.never_run += 1
            continue
        state = states[last]
        outcomes[state.outcome] = outcomes.get(state.outcome, 0) + 1
        report.unanswered += not state.answered
    report.outcomes = dict(sorted(outcomes.items()))
