"""Where a score came from: the provenance tree of a `Result`, summarised.

``provenance(store, result)`` walks the typed links down from a result: the task set and its
build, per pair and arm the build config (template, cohort and its version N.X, dataset and
release, builder and version, MedOmni release) and the answer key, and per job the agent
config, the runner, and what the runs report (outcomes, served models, encoders served,
attempts). It reads every run record once, in batches, so that a result over many thousands
of runs is summarised in histograms; the runs themselves are listed only when asked
(``runs=True``). Nothing here re-hashes a closure: that is `medomni_cas.audit.verify`.

`render_text` prints the tree compactly; the structs encode to JSON as they are.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable

import msgspec

from medomni_cas.audit._common import arm_label, load_result, short, split_pair
from medomni_cas.audit.attest import AttestationInfo, attestation_lines, attestations_of
from medomni_cas.bench.records import (
    AgentConfig,
    JobRecord,
    RunRecord,
    ScoreRow,
)
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.records import (
    AtomTask,
    BuildConfig,
    BuildResult,
    SetBuild,
    TaskSetRecord,
)

__all__ = [
    "AgentSummary",
    "BuildSummary",
    "EncoderSummary",
    "JobSummary",
    "Provenance",
    "RunSummary",
    "TaskSetSummary",
    "provenance",
    "render_text",
]

#: Score rows shown in text before the rest are counted (JSON always has them all).
TEXT_ROWS = 20


class _Report(msgspec.Struct, kw_only=True):
    """Base of the report structs (subclasses pass ``kw_only=True`` too: msgspec applies it
    per class), so fields are named at every call site and can be added in any order."""


class TaskSetSummary(_Report, kw_only=True):
    id: str
    name: str
    builder: str
    arms: list[str]
    pairs: dict[str, int]  # <template>@<cohort> -> the N it is pinned at


class BuildSummary(_Report, kw_only=True):
    """One pair under one arm (and rung) as the set build holds it."""

    pair: str
    arm: str
    arm_variant: str = ""
    version: str  # N.X, from the cohort file
    config: str  # the config hash
    result: str  # the `BuildResult`
    template: str
    cohort: str
    dataset: str
    dataset_release: str
    builder: str
    builder_version: str
    medomni_release: str
    targets: list[str]
    content: str
    answer_key: str
    atoms: int


class AgentSummary(_Report, kw_only=True):
    id: str
    name: str
    kind: str
    agent: str
    model: str
    route: str
    scaffold: str
    served_model: str  # what the config expects the provider to report
    limits: dict[str, float | int]


class EncoderSummary(_Report, kw_only=True):
    name: str
    version: str
    digest: str
    runs: int  # runs it was served to


class RunSummary(_Report, kw_only=True):
    id: str
    run_id: str
    pair: str
    patient: str
    attempt: int
    outcome: str
    served_model: str
    elapsed_ms: int
    predictions: int
    errors: list[str] = []


class JobSummary(_Report, kw_only=True):
    id: str
    name: str
    agent: AgentSummary
    runner: str
    arm: str
    arm_variant: str = ""
    repetition: int
    started: str
    set_build: str  # normally the result's; a different one is shown as a warning
    runs: int
    attempts: int  # runs recorded, infra retries included
    outcomes: dict[str, int]
    served_models: dict[str, int]  # what the runs report: model -> runs
    encoders_served: list[EncoderSummary]
    encoder_calls: int
    prediction_records: int
    predictions_table: str
    prediction_rows: int
    cost_usd: float | None = None
    run_list: list[RunSummary] | None = None  # only with ``runs=True``


class Provenance(_Report, kw_only=True):
    """A result and everything it was computed from, summarised."""

    result: str
    scorer: str
    scorer_version: str
    n_boot: int
    seed: int
    rows: list[ScoreRow]
    table: str
    task_set: TaskSetSummary
    set_build: str
    builds: list[BuildSummary]
    answer_keys: list[str]
    jobs: list[JobSummary]
    answer_columns: list[str] = []
    warnings: list[str] = []
    #: the signed attestations of the result this store's ``attestations/`` refs hold
    attestations: list[AttestationInfo] = []

    def __repr__(self) -> str:
        return "\n".join(render_text(self))

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(chr(10).join(render_text(self)))}</pre>"


def _builds(store: Store, set_build: SetBuild) -> list[BuildSummary]:
    entries = set_build.entries
    results = dict(store.get_many(_unique(e.result for e in entries), BuildResult))
    configs = dict(store.get_many(_unique(e.config for e in entries), BuildConfig))
    out = []
    for e in entries:
        r, c = results[e.result], configs[e.config]
        template, cohort = split_pair(c.pair)
        out.append(
            BuildSummary(
                pair=e.pair,
                arm=e.arm,
                arm_variant=e.arm_variant,
                version=c.version,
                config=e.config.hex(),
                result=e.result.hex(),
                template=str(c.template.get("name", template)),
                cohort=cohort,
                dataset=c.dataset,
                dataset_release=c.dataset_release,
                builder=c.builder,
                builder_version=c.builder_version,
                medomni_release=c.medomni_release,
                targets=[str(t.get("label", "")) for t in c.targets],
                content=r.content.hex(),
                answer_key=r.answer_key.hex(),
                atoms=len(r.atoms),
            )
        )
    return out


def _unique(ids: Iterable[ObjectId]) -> list[ObjectId]:
    return list(dict.fromkeys(ids))


def _agent(oid: ObjectId, a: AgentConfig) -> AgentSummary:
    limits = {k: v for k, v in msgspec.structs.asdict(a.limits).items() if v is not None}
    return AgentSummary(
        id=oid.hex(),
        name=a.name,
        kind=a.kind,
        agent=a.agent,
        model=a.model,
        route=a.route,
        scaffold=a.scaffold,
        served_model=a.served_model,
        limits=limits,
    )


def _patients(store: Store, runs: list[RunRecord]) -> dict[ObjectId, str]:
    """atom id -> patient, for the atoms these runs ran (read only to list runs)."""
    atoms = _unique(r.atom for r in runs)
    return {aid: atom.patient for aid, atom in store.get_many(atoms, AtomTask)}


def _job(
    store: Store, jid: ObjectId, job: JobRecord, agent: AgentSummary, *, runs: bool
) -> JobSummary:
    records = [r for _, r in store.get_many(job.runs, RunRecord)]
    outcomes: Counter[str] = Counter()
    served: Counter[str] = Counter()
    encoders: Counter[tuple[str, str, str]] = Counter()
    calls = preds = 0
    cost: float | None = None
    for r in records:
        outcomes[r.outcome] += 1
        served[r.served_model or "(not reported)"] += 1
        for e in r.agent_block.encoders_served:
            encoders[(e.name, e.version, e.digest)] += 1
        calls += r.agent_block.encoder_calls
        preds += len(r.predictions)
        if r.cost_usd is not None:
            cost = (cost or 0.0) + r.cost_usd
    table = store.get(job.predictions)  # `PredictionColumns` or, older, `PredictionTable`
    run_list = None
    if runs:
        patients = _patients(store, records)
        run_list = [
            RunSummary(
                id=rid.hex(),
                run_id=r.run_id,
                pair=r.pair,
                patient=patients.get(r.atom, "?"),
                attempt=r.attempt,
                outcome=r.outcome,
                served_model=r.served_model,
                elapsed_ms=r.elapsed_ms,
                predictions=len(r.predictions),
                errors=list(r.errors),
            )
            for rid, r in zip(job.runs, records, strict=True)
        ]
    return JobSummary(
        id=jid.hex(),
        name=job.name,
        agent=agent,
        runner=job.runner,
        arm=job.arm,
        arm_variant=job.arm_variant,
        repetition=job.repetition,
        started=job.started,
        set_build=job.set_build.hex(),
        runs=len(records),
        attempts=job.attempts,
        outcomes=dict(outcomes.most_common()),
        served_models=dict(served.most_common()),
        encoders_served=[
            EncoderSummary(name=n, version=v, digest=d, runs=c)
            for (n, v, d), c in sorted(encoders.items())
        ],
        encoder_calls=calls,
        prediction_records=preds,
        predictions_table=job.predictions.hex(),
        prediction_rows=table.rows,
        cost_usd=cost,
        run_list=run_list,
    )


def provenance(store: Store, result: str | ObjectId, *, runs: bool = False) -> Provenance:
    """The provenance of ``result`` (an id, a unique prefix or a ref name such as
    ``results/medomni-bench/v1``); ``runs`` also lists every run of every job."""
    rid, res = load_result(store, result)
    ts = store.get(res.task_set, TaskSetRecord)
    sb = store.get(res.set_build, SetBuild)
    warnings: list[str] = []
    if sb.task_set != res.task_set:
        warnings.append(
            f"the set build {short(res.set_build)} belongs to task set {short(sb.task_set)}, "
            f"not the result's {short(res.task_set)}"
        )
    jobs = dict(store.get_many(_unique(res.jobs), JobRecord))
    agents = dict(store.get_many(_unique(j.agent_config for j in jobs.values()), AgentConfig))
    job_summaries = []
    for jid in res.jobs:
        job = jobs[jid]
        summary = _job(
            store, jid, job, _agent(job.agent_config, agents[job.agent_config]), runs=runs
        )
        job_summaries.append(summary)
        if job.task_set != res.task_set:
            warnings.append(f"job {job.name} ran task set {short(job.task_set)}")
        if job.set_build != res.set_build:
            warnings.append(
                f"job {job.name} ran set build {short(job.set_build)}, the result scores "
                f"against {short(res.set_build)}"
            )
        expected = summary.agent.served_model
        other = sorted(m for m in summary.served_models if expected and m != expected)
        if other:
            warnings.append(
                f"job {job.name}: runs report served model {', '.join(other)}, the agent "
                f"config expects {expected}"
            )
    return Provenance(
        result=rid.hex(),
        scorer=res.scorer,
        scorer_version=res.scorer_version,
        n_boot=res.n_boot,
        seed=res.seed,
        rows=list(res.rows),
        table=res.table.hex(),
        task_set=TaskSetSummary(
            id=res.task_set.hex(),
            name=ts.name,
            builder=ts.builder,
            arms=list(ts.arms),
            pairs={p.task: p.n for p in ts.pairs},
        ),
        set_build=res.set_build.hex(),
        builds=_builds(store, sb),
        answer_keys=[k.hex() for k in res.answer_keys],
        answer_columns=[c.hex() for c in res.answer_columns],
        jobs=job_summaries,
        warnings=warnings,
        attestations=attestations_of(store, rid),
    )


# -- text ---------------------------------------------------------------------------------------
def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _histogram(counts: dict[str, int], unit: str = "") -> str:
    if unit:
        return ", ".join(f"{k} ({v} {unit})" for k, v in counts.items()) or "none"
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _score_lines(rows: list[ScoreRow]) -> list[str]:
    out = [f"  scores ({len(rows)} rows)"]
    for r in rows[:TEXT_ROWS]:
        ci = f" [{_num(r.ci_low)}, {_num(r.ci_high)}]" if r.ci_low is not None else ""
        missing = f", {r.n_missing} missing" if r.n_missing else ""
        flag = f"  ! {r.config_flag}" if r.config_flag else ""
        out.append(
            f"    {r.agent}  {arm_label(r.arm, r.arm_variant)}  {r.pair}  {r.target}  "
            f"{r.metric} {_num(r.value)}{ci}  n={r.n}{missing}{flag}"
        )
    if len(rows) > TEXT_ROWS:
        out.append(f"    … and {len(rows) - TEXT_ROWS} more (--json lists them all)")
    return out


def _build_lines(builds: list[BuildSummary]) -> list[str]:
    by_pair: dict[str, list[BuildSummary]] = {}
    for b in builds:
        by_pair.setdefault(b.pair, []).append(b)
    out = []
    for pair, group in by_pair.items():
        b = group[0]
        out.append(
            f"    {pair}  version {b.version}: template {b.template}, cohort {b.cohort}, "
            f"dataset {b.dataset} {b.dataset_release}"
        )
        out.append(
            f"      builder {b.builder} {b.builder_version}, MedOmni {b.medomni_release}; "
            f"targets {', '.join(b.targets)}"
        )
        keys = _unique(ObjectId.from_hex(x.answer_key) for x in group)
        out.append(
            f"      content {short(b.content)}, answer key " + ", ".join(short(k) for k in keys)
        )
        for x in group:
            # fields that are one per pair in practice, shown again only where an arm differs
            odd = [
                f"{f} {getattr(x, f)}"
                for f in ("version", "builder_version", "dataset_release")
                if getattr(x, f) != getattr(b, f)
            ]
            extra = f"  ({'; '.join(odd)})" if odd else ""
            out.append(
                f"      {arm_label(x.arm, x.arm_variant):<26} config {short(x.config)}  "
                f"{x.atoms} atoms{extra}"
            )
    return out


def _agent_lines(jobs: list[JobSummary]) -> list[str]:
    out = []
    for a in {j.agent.id: j.agent for j in jobs}.values():
        limits = ", ".join(f"{k} {v}" for k, v in a.limits.items())
        out.append(
            f"    {a.name}  config {short(a.id)}: agent {a.agent}, kind {a.kind}, model "
            f"{a.model}, route {a.route}, scaffold {a.scaffold}, expects served model "
            f"{a.served_model}" + (f"; limits {limits}" if limits else "")
        )
    return out


def _job_lines(j: JobSummary) -> list[str]:
    out = [
        f"    {j.agent.name}  {arm_label(j.arm, j.arm_variant)}  r{j.repetition}  "
        f"job {short(j.id)}  {j.name}",
        f"      runner {j.runner}; {j.runs} runs, {j.attempts} attempts: "
        f"{_histogram(j.outcomes)}; served models reported: "
        f"{_histogram(j.served_models, 'runs')}",
    ]
    if j.encoders_served:
        enc = ", ".join(
            f"{e.name} {e.version} {e.digest[:19]} ({e.runs} runs)" for e in j.encoders_served
        )
        out.append(f"      encoders served: {enc}; {j.encoder_calls} encoder calls")
    else:
        out.append("      encoders served: none")
    cost = f"; cost ${j.cost_usd:.2f}" if j.cost_usd is not None else ""
    out.append(
        f"      predictions: {j.prediction_records} records, table {short(j.predictions_table)}"
        f" ({j.prediction_rows} rows){cost}"
    )
    for r in j.run_list or ():
        errs = f"  {r.errors[0]}" if r.errors else ""
        out.append(
            f"        run {short(r.id)}  {r.pair}  patient {r.patient}  attempt {r.attempt}  "
            f"{r.outcome}  {r.served_model or '-'}  {r.elapsed_ms} ms{errs}"
        )
    return out


def render_text(p: Provenance) -> list[str]:
    """The provenance as an indented tree: result, scores, task set, builds, jobs."""
    ts = p.task_set
    pairs = ", ".join(f"{k} (N={n})" for k, n in ts.pairs.items())
    lines = [
        f"result {p.result}",
        f"  scorer {p.scorer} {p.scorer_version}, n_boot {p.n_boot}, seed {p.seed}, "
        f"table {short(p.table)}",
    ]
    lines += [f"  ! {w}" for w in p.warnings]
    lines += _score_lines(p.rows)
    lines += [
        f"  task set {ts.name}  {ts.id}",
        f"    builder {ts.builder}; arms {', '.join(ts.arms)}",
        f"    pairs {pairs}",
        f"  set build {short(p.set_build)} ({len(p.builds)} builds, "
        f"{sum(b.atoms for b in p.builds)} atom tasks)",
    ]
    lines += _build_lines(p.builds)
    lines.append("  agents")
    lines += _agent_lines(p.jobs)
    runs = sum(j.runs for j in p.jobs)
    lines.append(f"  jobs ({len(p.jobs)}, {runs} runs)")
    # text in a reading order; JSON keeps the result's own order
    for j in sorted(p.jobs, key=lambda j: (j.agent.name, j.arm, j.arm_variant, j.repetition)):
        lines += _job_lines(j)
    return lines + attestation_lines(p.attestations)
