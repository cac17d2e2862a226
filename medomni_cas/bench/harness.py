"""The harness: ``medomni bench run <benchmark>/<set> --agent <config>``.

1. Checks the whole set and runs nothing if any check fails: the built tasks (every atom's
   closure present and re-hashed; its format check readable), stand-in agents on each task
   (a null answer must fail the format check; the answer key, given from outside the task,
   must pass it and score perfectly), the agent's route against each dataset's policy (deny
   refuses; conditional needs ``accept_conditions``), and what the runner needs (its own
   `Runner.check`: the agent command, the perception service, an image).
2. Runs one job per arm (and rung) x repetition, slot by slot. A run slot's id is
   ``hash(atom, agent config, arm variant, repetition)``; ``runs/slots/<slot>`` points at its
   latest run, so resuming is one ref read per slot. A slot is claimed create-only
   (``runs/claims/<slot>``) before it runs, so two harnesses on one store never run it twice;
   a claim whose process is gone (same host) or older than ``claim_timeout`` is taken over,
   or removed when its slot has finished (its holder was killed before releasing it).
3. Records each trial as it ends (run, prediction records, answer, logs, encoder calls), and
   each job (`JobRecord` with its `PredictionColumns`), then writes the run folder as a view.

A slot is done when its run ended with an outcome of the agent's own. A run that failed for
the infrastructure is kept, and the slot runs again on resume, up to ``max_attempts``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from medomni_cas.bench.columns import PREDICTION_COLUMNS, ArmKey, arm_key, prediction_columns
from medomni_cas.bench.records import (
    AGENT_OUTCOMES,
    AgentBlock,
    AgentConfig,
    EncoderServed,
    JobRecord,
    PredictionRecord,
    RunRecord,
    slot_digests,
)
from medomni_cas.bench.replay import SLOT_REFS, agent_ref, slot_ref
from medomni_cas.bench.runners import Job, Runner, Trial, TrialSpec, get_runner
from medomni_cas.errors import MedomniError
from medomni_cas.store.ids import ObjectId, hash_bytes, id_from_digest
from medomni_cas.store.store import Store
from medomni_cas.store.verify import verify_closure
from medomni_cas.studio.arms import arm_builds, arm_label
from medomni_cas.studio.folders import load_dataset
from medomni_cas.studio.records import (
    SCORES_KEY,
    AnswerKey,
    AtomTask,
    BuildConfig,
    BuildResult,
    FormatCheck,
)
from medomni_cas.studio.tasksets import SetView, show_set

__all__ = [
    "PREDICTION_COLUMNS",
    "CheckFailed",
    "JobReport",
    "RunReport",
    "check_posix_permissions",
    "job_ref",
    "run_set",
    "run_states",
]

Progress = Callable[[str, int, int], None]  # (job name, slots done, slots in the job)


class CheckFailed(MedomniError):
    """The set failed its checks; nothing was run. ``problems`` lists every one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} check(s) failed; nothing was run:\n  {shown}{more}")


@dataclass
class JobReport:
    name: str
    job: ObjectId
    folder: Path
    slots: int
    ran: int
    skipped: int
    infra_errors: int


@dataclass
class RunReport:
    task_set: ObjectId
    agent_config: ObjectId
    jobs: list[JobReport] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        return sum(j.ran for j in self.jobs)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def job_ref(task_set: ObjectId, agent: ObjectId, arm_label: str, rep: int) -> str:
    key = hash_bytes(b"medomni.job\0" + task_set + agent + arm_label.encode() + b"\0%d" % rep)
    return f"runs/jobs/{key.hex()}"


def check_posix_permissions(folder: Path) -> None:
    """Refuse a runs folder whose file system ignores permissions (exFAT, FAT, some mounts):
    Harbor sets them in job folders, and a run folder must keep them."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".medomni-perm-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        os.chmod(probe, 0o640)
        ok = (os.stat(probe).st_mode & 0o777) == 0o640
        os.chmod(probe, 0o600)
        ok = ok and (os.stat(probe).st_mode & 0o777) == 0o600
    except OSError:
        ok = False
    finally:
        probe.unlink(missing_ok=True)
    if not ok:
        raise MedomniError(
            f"runs folder {folder}: its file system does not keep POSIX permissions (exFAT or "
            "FAT?); set `runs:` in workspace.yaml to a folder on ext4, xfs, btrfs or apfs"
        )


# -- checks ---------------------------------------------------------------------------------
def _entries(view: SetView, arms: Sequence[str] | None) -> list:  # type: ignore[type-arg]
    if arms:
        have = {e.arm for e in view.entries}
        unknown = [a for a in arms if a not in have]
        if unknown:
            raise MedomniError(
                f"task set {view.name} has no arm {unknown[0]!r} (has: {', '.join(sorted(have))})"
            )
        return [e for e in view.entries if e.arm in arms]
    return list(view.entries)


def _check_built(
    store: Store,
    entries: list,  # type: ignore[type-arg]
    problems: list[str],
) -> dict[ObjectId, list[tuple[ObjectId, AtomTask]]]:
    """Check every build; return each build's atoms in order, read once for the planning."""
    loaded: dict[ObjectId, list[tuple[ObjectId, AtomTask]]] = {}
    results = [e.result for e in entries]
    report = verify_closure(store, results)
    problems += [f"built tasks: {p}" for p in (str(x) for x in report.problems)]
    if report.problems:
        return loaded
    for e in entries:
        result = store.get(e.result, BuildResult)
        key = store.get(result.answer_key, AnswerKey)
        atoms = dict(store.get_many(result.atoms, AtomTask))
        loaded[e.result] = [(aid, atoms[aid]) for aid in result.atoms]
        checks: dict[ObjectId, FormatCheck] = {}
        for aid in result.atoms:
            atom = atoms[aid]
            check = checks.get(atom.format_check)
            if check is None:
                check = checks[atom.format_check] = store.get(atom.format_check, FormatCheck)
            where = f"{e.pair} {arm_label(atom.arm, atom.arm_variant)}"
            if not check.targets:
                problems.append(f"{where}: atom {aid}: the format check names no target")
                continue
            # stand-ins: the null agent must fail the format check
            if not check.problems({}):
                problems.append(f"{where}: atom {aid}: an empty answer passes the format check")
            # the oracle, handed the answers from outside the task, must pass it and be right
            truth = key.values.get(atom.patient)
            if truth is None:
                problems.append(f"{where}: patient {atom.patient} has no answer in the key")
                continue
            oracle = {t.name: truth.get(t.name) for t in check.targets}
            bad = check.problems(oracle)
            if bad:
                problems.append(f"{where}: atom {aid}: the oracle's answer fails: {bad[0]}")
            elif any(oracle[t] != truth.get(t) for t in oracle):
                problems.append(f"{where}: atom {aid}: the oracle does not score perfectly")
    return loaded


def _check_routes(
    store: Store,
    entries: list,  # type: ignore[type-arg]
    agent: AgentConfig,
    studio: Path | None,
    accept_conditions: bool,
    problems: list[str],
    notices: list[str],
) -> None:
    datasets = sorted({store.get(e.config, BuildConfig).dataset for e in entries})
    for ds_name in datasets:
        folder = studio / "datasets" / ds_name if studio is not None else None
        if folder is None or not (folder / "dataset.yaml").is_file():
            problems.append(
                f"route: no dataset.yaml for {ds_name} in the studio folder, so its route "
                "policy cannot be checked"
            )
            continue
        route = getattr(load_dataset(folder).routes, agent.route)
        if route.policy == "deny":
            problems.append(f"route: dataset {ds_name} denies the {agent.route} route")
        elif route.policy == "conditional":
            text = " ".join(route.conditions.split())
            if accept_conditions:
                notices.append(f"dataset {ds_name}, {agent.route} route: you accepted: {text}")
            else:
                problems.append(
                    f"route: dataset {ds_name} allows the {agent.route} route only if: {text} "
                    "(run again with --accept-conditions if you meet them)"
                )


class _RunState(msgspec.Struct):
    """What resume reads of a run record; msgspec skips the other fields undecoded."""

    outcome: str
    attempt: int


_RUN_STATE = msgspec.msgpack.Decoder(tuple[str, int, _RunState])


def run_states(store: Store, runs: list[ObjectId]) -> dict[ObjectId, tuple[str, int]]:
    """Each run's (outcome, attempt), read from its verified bytes: all resume needs."""
    out = {}
    for rid, data in store.get_raw_many(runs):  # verified bytes
        kind, _, state = _RUN_STATE.decode(data)  # type: ignore[arg-type]
        if kind != RunRecord.__kind__:
            raise MedomniError(f"run slot points at {rid}, a {kind}, not a run record")
        out[rid] = (state.outcome, state.attempt)
    return out


# -- claims ---------------------------------------------------------------------------------
def _claim_ref(slot: ObjectId) -> str:
    return f"runs/claims/{slot.hex()}"


def _claim_blob(store: Store) -> ObjectId:
    me = f"{socket.gethostname()} {os.getpid()} {time.time():.3f}\n"
    return store.put_blob(me.encode())


def _stale(store: Store, claim: ObjectId, timeout: float) -> bool:
    try:
        host, pid, t = store.read_blob(claim).decode().split()
    except (ValueError, KeyError):
        return True
    if time.time() - float(t) > timeout:
        return True
    if host == socket.gethostname():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def _claim(store: Store, slot: ObjectId, timeout: float) -> bool:
    ref = _claim_ref(slot)
    mine = _claim_blob(store)
    if store.refs.add_if_new(ref, mine, "claim"):
        return True
    current = store.refs.get(ref)
    if current is None:
        return store.refs.add_if_new(ref, mine, "claim")
    if _stale(store, current, timeout):
        return store.refs.set_if_equals(ref, current, mine, "take over a stale claim")
    return False


def _sweep(store: Store, slots: list[bytes], running: set[bytes], timeout: float) -> None:
    """Remove the stale claims of this job's slots that are not to run: a harness killed
    after recording a slot's run and before releasing its claim leaves one behind. A claim
    whose holder is alive is kept (it may be just about to release it)."""
    claims = store.refs.as_dict("runs/claims/")  # only slots being run: few
    if not claims:
        return
    finished = set(slots) - running
    for name, claim in claims.items():
        try:
            slot = bytes.fromhex(name.rsplit("/", 1)[1])
        except ValueError:
            continue  # not a claim this harness made
        if slot in finished and _stale(store, claim, timeout):
            store.refs.remove_if_equals(name, claim, "stale claim of a finished slot")


def _release(store: Store, slot: ObjectId) -> None:
    ref = _claim_ref(slot)
    current = store.refs.get(ref)
    if current is not None:
        store.refs.remove_if_equals(ref, current, "done")


# -- recording ------------------------------------------------------------------------------
def _record(
    store: Store,
    job: Job,
    spec: TrialSpec,
    trial: Trial,
    task_set: ObjectId,
    previous: ObjectId | None,
) -> ObjectId:
    errors = list(trial.errors)
    outcome = trial.outcome
    answer_id = store.put_blob(trial.answer) if trial.answer is not None else None
    values: dict[str, object] = {}
    if outcome == "answered":
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
        if job.agent.served_model and trial.served_model != job.agent.served_model:
            outcome = "agent-failed"
            errors.append(
                f"served model {trial.served_model!r} is not the config's "
                f"{job.agent.served_model!r}"
            )
            values = {}
    run_id = f"{spec.slot.hex()}-{trial.attempt}"
    scores: dict[str, dict[str, float]] = values.get(SCORES_KEY, {})  # type: ignore[assignment]
    preds = [
        PredictionRecord(
            run_id=run_id,
            atom=spec.atom_id,
            target=t.name,
            value=values[t.name] if t.kind == "class" else float(values[t.name]),  # type: ignore[arg-type]
            intelligence=job.agent.kind,
            scores={c: float(p) for c, p in scores.get(t.name, {}).items()},
        )
        for t in spec.format_check.targets
        if t.name in values
    ]
    pred_ids = store.put_many(preds)
    log_id = None
    if trial.encoder_calls:
        lines = b"".join(msgspec.json.encode(c) + b"\n" for c in trial.encoder_calls)
        log_id = store.put_blob(lines)
    from medomni_cas.bench.perception import meets_arm

    ok, why = (True, "")
    if job.encoders != "none" or trial.encoder_calls:
        ok, why = meets_arm(job.encoders, _calls(trial))
    logs = None
    if trial.logs:
        logs = store.put_tree({n: store.put_blob(b) for n, b in sorted(trial.logs.items())})
    ok_calls = sum(1 for c in trial.encoder_calls if c.get("status") == "ok")
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
            encoder_calls=ok_calls,
            encoder_log=log_id,
            meets_arm=ok,
            meets_arm_reason=why,
            files_opened=tuple(trial.files_opened),
        ),
        answer=answer_id,
        logs=logs,
        predictions=tuple(pred_ids),
    )
    rid = store.put(record)
    store.refs.set(
        slot_ref(spec.slot), rid, expected=previous, message=f"{outcome} attempt {trial.attempt}"
    )
    return rid


def _calls(trial: Trial) -> list:  # type: ignore[type-arg]
    from medomni_cas.bench.perception import EncoderCall

    return [msgspec.convert(c, EncoderCall) for c in trial.encoder_calls]


# -- jobs -----------------------------------------------------------------------------------
def _folder_name(set_name: str, agent: str, arm_label: str, rep: int, stamp: str) -> str:
    return f"{set_name.replace('/', '.')}--{agent}--{arm_label}--r{rep}--{stamp}"


def run_set(
    store: Store,
    name: str,
    agent: AgentConfig,
    *,
    runs_dir: Path,
    studio: Path | None,
    runner: str | Runner = "process",
    arms: Sequence[str] | None = None,
    reps: int = 1,
    accept_conditions: bool = False,
    max_attempts: int = 3,
    budget: int = 8,
    claim_timeout: float = 6 * 3600.0,
    progress: Progress | None = None,
    shard: tuple[int, int] | None = None,
) -> RunReport:
    """Check the set, then run what has not run yet; see the module docstring.

    ``shard=(i, n)`` runs only the slots whose id falls in shard i of n, so machines can
    share a set on one store; each writes its jobs' records, and a last unsharded run (which
    finds every slot done) records every job whole.
    """
    if reps < 1:
        raise MedomniError(f"--reps must be at least 1, got {reps}")
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise MedomniError(f"shard {shard[0]}/{shard[1]}: want i/n with 0 <= i < n")
    view = show_set(store, name)
    if not view.entries:
        raise MedomniError(f"task set {name} has no build; run `medomni studio taskset build`")
    entries = _entries(view, arms)
    impl = get_runner(runner) if isinstance(runner, str) else runner
    check_posix_permissions(runs_dir)
    agent_id = store.put(agent)
    problems: list[str] = []
    notices: list[str] = []
    built = _check_built(store, entries, problems)
    _check_routes(store, entries, agent, studio, accept_conditions, problems, notices)
    if problems:  # damaged tasks cannot even be planned; report before reading them again
        raise CheckFailed(sorted(dict.fromkeys(problems)))

    builds = arm_builds(view.record.builder)
    # one job per arm (and rung) x repetition, over every pair of the set
    groups: dict[tuple[str, str], list] = {}  # type: ignore[type-arg]
    for e in entries:
        groups.setdefault((e.arm, e.arm_variant), []).append(e)
    jobs: list[tuple[Job, dict[ObjectId, ObjectId | None], list[bytes], ArmKey]] = []
    checks: dict[ObjectId, FormatCheck] = {}
    for (arm, variant), group in groups.items():
        encoders = builds[arm].encoders if arm in builds else "none"
        label = arm_label(arm, variant)
        atoms: list[tuple[ObjectId, AtomTask]] = []
        for e in group:
            atoms += built[e.result]
        key = arm_key(store, view.build, arm, variant)  # type: ignore[arg-type]
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
            )
            previous: dict[ObjectId, ObjectId | None] = {}
            # resume: one batch of ref reads per job, then only outcome and attempt of runs
            slots = slot_digests([aid for aid, _ in atoms], agent_id, label, rep)
            lasts = store.refs.get_many_ids(SLOT_REFS, slots)
            states = run_states(store, [r for r in lasts if r is not None])
            for (aid, atom), slot, last in zip(atoms, slots, lasts, strict=True):
                if shard is not None and int.from_bytes(slot[:8], "big") % shard[1] != shard[0]:
                    continue
                attempt = 1
                if last is not None:
                    outcome, tried = states[last]
                    if outcome in AGENT_OUTCOMES or tried >= max_attempts:
                        continue  # done (or given up on): resume skips it
                    attempt = tried + 1
                check = checks.get(atom.format_check)
                if check is None:
                    check = checks[atom.format_check] = store.get(atom.format_check, FormatCheck)
                slot = id_from_digest(slot)  # only a slot that runs needs its id
                job.trials.append(TrialSpec(slot, attempt, aid, atom, check))
                previous[slot] = last
            jobs.append((job, previous, slots, key))
            if job.trials:
                problems += [f"{label} r{rep}: {p}" for p in impl.check(job)]
    if problems:
        raise CheckFailed(sorted(dict.fromkeys(problems)))

    report = RunReport(view.task_set, agent_id, notices=notices)
    if store.refs.get(agent_ref(agent.name)) != agent_id:
        # harnesses of one set may start together: retry, the last config named wins
        store.refs.update(agent_ref(agent.name), lambda _cur: agent_id, message="bench run")
    for job, previous, slots, key in jobs:
        report.jobs.append(
            _run_job(
                store, view, impl, job, previous, slots, key, runs_dir, claim_timeout, progress
            )
        )
    return report


def _run_job(
    store: Store,
    view: SetView,
    impl: Runner,
    job: Job,
    previous: dict[ObjectId, ObjectId | None],
    slots: list[bytes],
    key: ArmKey,
    runs_dir: Path,
    claim_timeout: float,
    progress: Progress | None,
) -> JobReport:
    ref = job_ref(view.task_set, job.agent_id, job.arm_label, job.repetition)
    old_job = store.refs.get(ref)
    if old_job is not None:
        old = store.get(old_job, JobRecord)
        started, job.name = old.started, old.name
    else:
        # The name is kept from the job's first start (`runs/job-names/<key>`), so a job
        # killed before its record was written resumes in the same run folder, where a
        # runner may keep files of its own (the Harbor runner's job folders).
        name_ref = "runs/job-names/" + ref.rsplit("/", 1)[1]
        pending = store.refs.get(name_ref)
        if pending is None:
            started = _now()
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
            name = _folder_name(view.name, job.agent.name, job.arm_label, job.repetition, stamp)
            mine = store.put_blob(f"{started}\n{name}".encode())
            if not store.refs.add_if_new(name_ref, mine, "job started"):
                pending = store.refs.get(name_ref)  # another harness started it first
            else:
                pending = mine
        started, job.name = store.read_blob(pending).decode().split("\n", 1)  # type: ignore[arg-type]
    job.folder = runs_dir / job.name
    ran = infra = 0
    _sweep(store, slots, {t.slot for t in job.trials}, claim_timeout)
    if job.trials:
        # claim every slot first: another harness on this store skips what we hold
        job.trials = [t for t in job.trials if _claim(store, t.slot, claim_timeout)]
        specs = {t.slot: t for t in job.trials}
        try:
            if job.trials:
                job.folder.mkdir(parents=True, exist_ok=True)
                impl.prepare(job)
                done = 0
                for stream in (impl.run(job), impl.collect(job)):
                    for trial in stream:
                        spec = specs.pop(trial.slot, None)
                        if spec is None:
                            continue  # a runner reporting a slot twice, or one not ours
                        _record(store, job, spec, trial, view.task_set, previous[trial.slot])
                        _release(store, trial.slot)
                        ran += 1
                        infra += trial.outcome == "infra-error"
                        done += 1
                        if progress is not None:
                            progress(job.name, done, len(job.trials))
        finally:
            for slot in specs:
                _release(store, slot)  # not run (runner stopped early): free for the next try
    run_ids = _final_runs(store, slots)
    runs = [store.get(r, RunRecord) for r in run_ids]
    table = store.put(prediction_columns(store, key, runs, job.agent.kind))
    record = JobRecord(
        name=job.name,
        task_set=view.task_set,
        set_build=view.build,  # type: ignore[arg-type]
        agent_config=job.agent_id,
        arm=job.arm,
        arm_variant=job.arm_variant,
        repetition=job.repetition,
        runner=impl.name,
        runs=tuple(run_ids),
        attempts=sum(r.attempt for r in runs),
        predictions=table,
        started=started,
    )
    jid = store.put(record)
    if old_job != jid:
        store.refs.update(ref, lambda _cur: jid, message=f"job {job.name}")
    if runs:
        from medomni_cas.bench.runfolders import write_run_folder

        write_run_folder(store, jid, runs_dir / job.name)
    return JobReport(job.name, jid, runs_dir / job.name, len(slots), ran, len(slots) - ran, infra)


def _final_runs(store: Store, slots: list[bytes]) -> list[ObjectId]:
    return [rid for rid in store.refs.get_many_ids(SLOT_REFS, slots) if rid is not None]
