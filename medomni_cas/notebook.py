"""The notebook API: a workspace's task sets, runs, predictions and results as tables.

>>> import medomni_cas as mc
>>> ws = mc.open_workspace("path/to/workspace")        # or a store URL: lmdb://…, s3://…
>>> ws.build("medomni-bench/v1", data_root="path/to/data")
>>> ws.run("medomni-bench/v1", "baseline", arms=["no-perception"])
>>> ws.score("medomni-bench/v1")                        # a ResultView: shows its table
>>> ws.runs_df("medomni-bench/v1").groupby("outcome").size()
>>> ws.provenance("medomni-bench/v1")                   # where the latest score came from
>>> ws.verify("medomni-bench/v1")                       # every object re-hashed: ok?

Porcelain over Studio and Bench, reading only what the records hold. Every table method
returns a ``pyarrow.Table`` and has a ``…_df`` twin returning a pandas DataFrame (pandas
is imported only then). Ids in tables are full lowercase hex, so tables join on them
(``runs`` and ``predictions`` on ``run_id``, ``atoms`` and ``runs`` on ``atom``); reprs show
them as 12 characters. Records are immutable, so what is read by id is cached by id.

`build`, `run` and `verify` show a progress bar (``tqdm.auto``: a widget in Jupyter when
ipywidgets is installed, a text bar otherwise).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from medomni_cas.audit.provenance import Provenance, provenance
from medomni_cas.audit.verify import VerifyReport, verify_result
from medomni_cas.bench.agents import find_agent, load_agent
from medomni_cas.bench.harness import PREDICTION_COLUMNS, RunReport, run_set
from medomni_cas.bench.records import AgentConfig, JobRecord, Result, RunRecord, ScoreRow
from medomni_cas.bench.runners import Runner
from medomni_cas.bench.scorer import (
    jobs_of,
    prediction_table,
    result_ref,
    score_jobs,
    write_results,
)
from medomni_cas.errors import InvalidName, MedomniError
from medomni_cas.store._html import esc, grid, id_html, kv_table, value_html
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.url import open_store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.benchmarks import open_benchmark, split_set_name
from medomni_cas.studio.records import AtomTask, BuildResult, SetBuild, SetEntry, TaskSetRecord
from medomni_cas.studio.tasksets import build_set, set_build_ref, show_set
from medomni_cas.workspace import load_workspace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ResultView", "TaskSetView", "WorkspaceView", "open_workspace"]

_S = pa.string()
TASK_SET_SCHEMA = pa.schema(
    [
        ("name", _S),
        ("task_set", _S),
        ("builder", _S),
        ("arms", pa.list_(_S)),
        ("pairs", pa.list_(_S)),  # "<template>@<cohort> (N=n)"
        ("build", _S),  # the latest SetBuild of this set, if any
        ("entries", pa.int32()),  # pairs x arms (and rungs) built
        ("built", pa.bool_()),
    ]
)
ATOM_SCHEMA = pa.schema(
    [
        ("pair", _S),
        ("version", _S),
        ("arm", _S),
        ("arm_variant", _S),
        ("patient", _S),
        ("atom", _S),
        ("config", _S),
        ("prediction_time", _S),
        ("families", pa.list_(_S)),
        ("build", _S),  # the pair's BuildResult
    ]
)
RUN_SCHEMA = pa.schema(
    [
        ("set", _S),
        ("task_set", _S),
        ("job", _S),  # the run folder's name
        ("job_id", _S),
        ("agent", _S),
        ("agent_config", _S),
        ("arm", _S),
        ("arm_variant", _S),
        ("repetition", pa.int32()),
        ("pair", _S),
        ("task_version", _S),
        ("config", _S),
        ("atom", _S),
        ("run_id", _S),
        ("record", _S),  # the RunRecord's id
        ("outcome", _S),
        ("attempt", pa.int32()),
        ("runner", _S),
        ("served_model", _S),
        ("started", _S),
        ("finished", _S),
        ("elapsed_ms", pa.int64()),
        ("cost_usd", pa.float64()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("encoder_calls", pa.int32()),
        ("meets_arm", pa.bool_()),
        ("errors", pa.list_(_S)),
    ]
)
_JOB_COLUMNS = [("set", _S), ("job", _S), ("job_id", _S)]
_RESULT_COLUMNS = [("set", _S), ("result", _S), ("task_set", _S)]
_SCORE_TYPES = {
    "value": pa.float64(),
    "ci_low": pa.float64(),
    "ci_high": pa.float64(),
    "n": pa.int64(),
    "n_missing": pa.int64(),
    "attempts": pa.int64(),
}


def _prediction_schema() -> pa.Schema:
    def typ(c: str) -> pa.DataType:
        if c == "value_num":
            return pa.float64()
        return pa.int32() if c in ("repetition", "attempt") else _S

    return pa.schema(_JOB_COLUMNS + [(c, typ(c)) for c in PREDICTION_COLUMNS])


def _score_schema() -> pa.Schema:
    fields = [(f, _SCORE_TYPES.get(f, _S)) for f in ScoreRow.__struct_fields__]
    return pa.schema(_RESULT_COLUMNS + fields)


def _concat(tables: list[pa.Table], empty: pa.Schema) -> pa.Table:
    if not tables:
        return empty.empty_table()
    return pa.concat_tables(tables, promote_options="default")


def _prepend(
    table: pa.Table, columns: list[tuple[str, pa.DataType]], values: list[str]
) -> pa.Table:
    for i, ((name, typ), value) in enumerate(zip(columns, values, strict=True)):
        table = table.add_column(i, pa.field(name, typ), pa.array([value] * table.num_rows, typ))
    return table


def _df(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()


def _text_table(columns: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = [columns, *rows]
    return "\n".join(
        indent + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _bar(**kw: Any) -> Any:
    """A tqdm bar: a widget in Jupyter when ipywidgets is installed, else a text bar."""
    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)  # "IProgress not found": text it is
        from tqdm.auto import tqdm
    return tqdm(**kw)


# -- views ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TaskSetView:
    """A recorded task set and its latest build: what ``studio taskset show`` prints."""

    name: str
    task_set: ObjectId  # the task set content hash
    record: TaskSetRecord
    build: ObjectId | None  # the latest SetBuild of this very set, if any
    entries: tuple[SetEntry, ...]  # one per pair x arm (and rung) built
    store: Store = field(repr=False)

    @property
    def pairs(self) -> list[str]:
        return [f"{p.task} (N={p.n})" for p in self.record.pairs]

    def atoms(self) -> pa.Table:
        """One row per atom task: pair, version, arm, variant, patient, atom id, config
        hash, prediction time, families staged and the pair's build."""
        results = dict(self.store.get_many([e.result for e in self.entries], BuildResult))
        ids = [a for e in self.entries for a in results[e.result].atoms]
        atoms = dict(self.store.get_many(dict.fromkeys(ids), AtomTask))
        cols: dict[str, list[object]] = {f.name: [] for f in ATOM_SCHEMA}
        for e in self.entries:
            for aid in results[e.result].atoms:
                atom = atoms[aid]
                row = {
                    "pair": e.pair,
                    "version": e.version,
                    "arm": e.arm,
                    "arm_variant": e.arm_variant,
                    "patient": atom.patient,
                    "atom": aid.hex(),
                    "config": e.config.hex(),
                    "prediction_time": atom.prediction_time,
                    "families": list(atom.families),
                    "build": e.result.hex(),
                }
                for k, v in row.items():
                    cols[k].append(v)
        return pa.table(cols, schema=ATOM_SCHEMA)

    def atoms_df(self) -> pd.DataFrame:
        return _df(self.atoms())

    def __repr__(self) -> str:
        r = self.record
        built = f"build {self.build.short}" if self.build is not None else "not built"
        head = [
            f"TaskSetView {self.name}",
            f"  task set {self.task_set.short}  builder {r.builder}  {built}",
            f"  arms     {', '.join(r.arms)}",
            f"  pairs    {', '.join(self.pairs)}",
        ]
        if not self.entries:
            return "\n".join(head)
        rows = [
            [e.pair, e.version, arm_label(e.arm, e.arm_variant), e.config.short]
            for e in self.entries
        ]
        return "\n".join(head) + "\n" + _text_table(["pair", "version", "arm", "config"], rows)

    def _repr_html_(self) -> str:
        r = self.record
        head = kv_table(
            [
                ("task set", id_html(self.task_set)),
                ("builder", esc(r.builder)),
                ("arms", esc(", ".join(r.arms))),
                ("pairs", "<br>".join(esc(p) for p in self.pairs)),
                ("build", id_html(self.build) if self.build is not None else "not built"),
            ],
            caption=f"<b>TaskSetView</b> {esc(self.name)}",
        )
        rows = [
            [
                esc(e.pair),
                esc(e.version),
                esc(arm_label(e.arm, e.arm_variant)),
                id_html(e.config),
                id_html(e.result),
            ]
            for e in self.entries
        ]
        entries = grid(["pair", "version", "arm", "config hash", "build"], rows)
        return head + (entries if rows else "")


@dataclass(frozen=True, eq=False)
class ResultView:
    """A stored score: its rows as a table, and the record that links what it came from."""

    id: ObjectId
    record: Result
    set_name: str
    table: pa.Table  # the rows, read from the result's Parquet blob

    @property
    def task_set(self) -> ObjectId:
        return self.record.task_set

    @property
    def jobs(self) -> tuple[ObjectId, ...]:
        return self.record.jobs

    def df(self) -> pd.DataFrame:
        return _df(self.table)

    def _header(self) -> list[tuple[str, str]]:
        r = self.record
        return [
            ("set", self.set_name),
            ("task set", r.task_set.hex()),
            ("scorer", f"{r.scorer} {r.scorer_version}"),
            ("bootstrap", f"n_boot={r.n_boot} seed={r.seed}"),
            ("jobs", str(len(r.jobs))),
            ("answer keys", str(len(r.answer_keys))),
        ]

    def _rows(self) -> list[list[str]]:
        return [
            [
                s.agent,
                arm_label(s.arm, s.arm_variant),
                s.pair,
                s.target,
                s.metric,
                _fmt(s.value),
                f"[{_fmt(s.ci_low)}, {_fmt(s.ci_high)}]",
                str(s.n),
                str(s.n_missing),
                s.config_flag,
            ]
            for s in self.record.rows
        ]

    _COLUMNS = ("agent", "arm", "pair", "target", "metric", "value", "95% CI", "n", "missing")

    def __repr__(self) -> str:
        head = [f"ResultView {self.id.short} ({self.set_name})"]
        head += [f"  {k:<11} {v[:12] if k == 'task set' else v}" for k, v in self._header()[1:]]
        rows = self._rows()
        flagged = any(r[-1] for r in rows)
        cols = [*self._COLUMNS, "flag"] if flagged else list(self._COLUMNS)
        body = [r if flagged else r[:-1] for r in rows]
        return "\n".join(head) + "\n" + _text_table(cols, body)

    def _repr_html_(self) -> str:
        items = [(k, id_html(v) if k == "task set" else esc(v)) for k, v in self._header()]
        head = kv_table(items, caption=f"<b>ResultView</b> {id_html(self.id)}")
        rows = [[esc(c) for c in r] for r in self._rows()]
        return head + grid([*self._COLUMNS, "flag"], rows)


@dataclass(frozen=True)
class _Job:
    id: ObjectId
    record: JobRecord
    set_name: str
    agent: str


class WorkspaceView:
    """A store and, when opened from a workspace folder, its studio, bench and runs folders.

    Made by `open_workspace`. Folders are None for a store opened by URL; `build`, `run`
    and `score` then take them as arguments.
    """

    def __init__(
        self,
        store: Store,
        *,
        root: Path | None = None,
        studio_dir: Path | None = None,
        bench_dir: Path | None = None,
        runs_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.root = root
        self.studio_dir = studio_dir
        self.bench_dir = bench_dir
        self.runs_dir = runs_dir
        self._set_names: dict[ObjectId, str] = {}
        self._agent_names: dict[ObjectId, str] = {}

    @property
    def url(self) -> str:
        return self.store.url

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> WorkspaceView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names (records are immutable: cache by id) ---------------------------------------------
    def _names_of_sets(self, ids: Iterable[ObjectId]) -> dict[ObjectId, str]:
        want = [i for i in dict.fromkeys(ids) if i not in self._set_names]
        for oid, rec in self.store.get_many(want, TaskSetRecord):
            self._set_names[oid] = rec.name
        return self._set_names

    def _names_of_agents(self, ids: Iterable[ObjectId]) -> dict[ObjectId, str]:
        want = [i for i in dict.fromkeys(ids) if i not in self._agent_names]
        for oid, rec in self.store.get_many(want, AgentConfig):
            self._agent_names[oid] = rec.name
        return self._agent_names

    def _jobs(self, set_name: str | None, agent: str | Sequence[str] | None) -> list[_Job]:
        ids = [jid for _, jid in self.store.refs.items("runs/jobs/")]
        records = dict(self.store.get_many(dict.fromkeys(ids), JobRecord))
        sets = self._names_of_sets(r.task_set for r in records.values())
        agents = self._names_of_agents(r.agent_config for r in records.values())
        wanted = {agent} if isinstance(agent, str) else set(agent) if agent else None
        jobs = [
            _Job(jid, r, sets[r.task_set], agents[r.agent_config]) for jid, r in records.items()
        ]
        jobs = [
            j
            for j in jobs
            if (set_name is None or j.set_name == set_name)
            and (wanted is None or j.agent in wanted)
        ]
        return sorted(
            jobs,
            key=lambda j: (
                j.set_name,
                j.agent,
                j.record.arm,
                j.record.arm_variant,
                j.record.repetition,
                j.record.started,
            ),
        )

    # -- task sets -------------------------------------------------------------------------------
    def task_set_names(self) -> list[str]:
        return sorted(n.removeprefix("tasksets/") for n, _ in self.store.refs.items("tasksets/"))

    def task_sets(self) -> pa.Table:
        """One row per recorded task set (``tasksets/…``) with its latest build
        (``studio/sets/…``): name, task set hash, builder, arms, pairs, entries built."""
        refs = dict(self.store.refs.items("tasksets/"))
        builds = dict(self.store.refs.items("studio/sets/"))
        records = dict(self.store.get_many(dict.fromkeys(refs.values()), TaskSetRecord))
        set_builds = dict(self.store.get_many(dict.fromkeys(builds.values()), SetBuild))
        cols: dict[str, list[object]] = {f.name: [] for f in TASK_SET_SCHEMA}
        for ref in sorted(refs):
            name = ref.removeprefix("tasksets/")
            rid = refs[ref]
            rec = records[rid]
            sb_id = builds.get(set_build_ref(name))
            sb = set_builds.get(sb_id) if sb_id is not None else None
            if sb is not None and sb.task_set != rid:
                sb_id, sb = None, None  # built before the set last grew
            row = {
                "name": name,
                "task_set": rid.hex(),
                "builder": rec.builder,
                "arms": list(rec.arms),
                "pairs": [f"{p.task} (N={p.n})" for p in rec.pairs],
                "build": sb_id.hex() if sb_id is not None else None,
                "entries": len(sb.entries) if sb is not None else 0,
                "built": sb is not None,
            }
            for k, v in row.items():
                cols[k].append(v)
        return pa.table(cols, schema=TASK_SET_SCHEMA)

    def task_sets_df(self) -> pd.DataFrame:
        return _df(self.task_sets())

    def task_set(self, name: str) -> TaskSetView:
        """The recorded set ``<benchmark>/<set>`` and its latest build."""
        v = show_set(self.store, name)
        return TaskSetView(v.name, v.task_set, v.record, v.build, v.entries, self.store)

    # -- runs and predictions --------------------------------------------------------------------
    def runs(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pa.Table:
        """The final run of every slot of every job (``runs/jobs/…``), one row each;
        optionally of one task set (by name: every version of it) and some agents."""
        cols: dict[str, list[object]] = {f.name: [] for f in RUN_SCHEMA}
        for job in self._jobs(set_name, agent):
            j = job.record
            for rid, run in self.store.get_many(j.runs, RunRecord):
                block = run.agent_block
                row = {
                    "set": job.set_name,
                    "task_set": j.task_set.hex(),
                    "job": j.name,
                    "job_id": job.id.hex(),
                    "agent": job.agent,
                    "agent_config": j.agent_config.hex(),
                    "arm": j.arm,
                    "arm_variant": j.arm_variant,
                    "repetition": j.repetition,
                    "pair": run.pair,
                    "task_version": run.task_version,
                    "config": run.config.hex(),
                    "atom": run.atom.hex(),
                    "run_id": run.run_id,
                    "record": rid.hex(),
                    "outcome": run.outcome,
                    "attempt": run.attempt,
                    "runner": run.runner,
                    "served_model": run.served_model,
                    "started": run.started,
                    "finished": run.finished,
                    "elapsed_ms": run.elapsed_ms,
                    "cost_usd": run.cost_usd,
                    "tokens_in": run.tokens_in,
                    "tokens_out": run.tokens_out,
                    "encoder_calls": block.encoder_calls,
                    "meets_arm": block.meets_arm,
                    "errors": list(run.errors),
                }
                for k, v in row.items():
                    cols[k].append(v)
        return pa.table(cols, schema=RUN_SCHEMA)

    def runs_df(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pd.DataFrame:
        return _df(self.runs(set_name, agent))

    def predictions(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pa.Table:
        """Every job's prediction table, one after the other, with the set and job in front:
        one blob read per job, never one per prediction."""
        tables = [
            _prepend(
                prediction_table(self.store, job.record),
                _JOB_COLUMNS,
                [job.set_name, job.record.name, job.id.hex()],
            )
            for job in self._jobs(set_name, agent)
        ]
        return _concat(tables, _prediction_schema())

    def predictions_df(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pd.DataFrame:
        return _df(self.predictions(set_name, agent))

    # -- results ---------------------------------------------------------------------------------
    def results(self, set_name: str | None = None) -> pa.Table:
        """The score rows of the latest result of each set (``results/<set>``), or of one."""
        if set_name is not None:
            rid = self.store.refs.get(result_ref(set_name))
            refs = {set_name: rid} if rid is not None else {}
        else:
            refs = {n.removeprefix("results/"): rid for n, rid in self.store.refs.items("results/")}
        tables = []
        for name in sorted(refs):
            view = self.result(refs[name])
            tables.append(
                _prepend(view.table, _RESULT_COLUMNS, [name, view.id.hex(), view.task_set.hex()])
            )
        return _concat(tables, _score_schema())

    def results_df(self, set_name: str | None = None) -> pd.DataFrame:
        return _df(self.results(set_name))

    def result(self, ref_or_id: str | ObjectId) -> ResultView:
        """A result by set name (its latest), ref name, id or id prefix."""
        rid: ObjectId | None = None
        if isinstance(ref_or_id, ObjectId):
            rid = ref_or_id
        else:
            try:
                rid = self.store.refs.get(result_ref(ref_or_id))
            except InvalidName:
                rid = None
            if rid is None:
                rid = self.store.resolve(ref_or_id)
        rec = self.store.get(rid, Result)
        table = pq.read_table(pa.BufferReader(self.store.read_blob(rec.table)))
        name = self._names_of_sets([rec.task_set])[rec.task_set]
        return ResultView(rid, rec, name, table)

    # -- doing things ----------------------------------------------------------------------------
    def _folder(self, given: str | Path | None, mine: Path | None, what: str) -> Path:
        if given is not None:
            return Path(given)
        if mine is None:
            raise MedomniError(
                f"this workspace ({self.url}) has no {what} folder: pass {what}=, or open a "
                "workspace folder whose workspace.yaml names it"
            )
        return mine

    def build(
        self,
        set_name: str,
        *,
        data_root: str | Path | None = None,
        progress: bool = True,
        studio: str | Path | None = None,
        bench: str | Path | None = None,
    ) -> TaskSetView:
        """Build every pair of ``<benchmark>/<set>`` under every arm (`build_set`) from the
        workspace's studio and bench folders; ``data_root`` is where the dataset's files are
        (default: its folder in the studio)."""
        studio_dir = self._folder(studio, self.studio_dir, "studio")
        bench_dir = self._folder(bench, self.bench_dir, "bench")
        b_name, s_name = split_set_name(set_name)
        ts = open_benchmark(b_name, bench_root=bench_dir, studio=studio_dir).sets.get(s_name)
        bar = _bar(
            total=len(ts.pairs) if ts is not None else None,
            unit="pair",
            desc=set_name,
            disable=not progress,
        )
        with bar:
            build_set(
                self.store,
                set_name,
                studio=studio_dir,
                bench=bench_dir,
                data_root=data_root,
                progress=lambda msg: bar.set_postfix_str(msg[-60:]),
                on_pair=lambda _pair, _builds: bar.update(1),
            )
        return self.task_set(set_name)

    def run(
        self,
        set_name: str,
        agent: str | Path | AgentConfig,
        arms: Sequence[str] | None = None,
        runner: str | Runner = "process",
        *,
        progress: bool = True,
        studio: str | Path | None = None,
        bench: str | Path | None = None,
        runs_dir: str | Path | None = None,
        **options: Any,
    ) -> RunReport:
        """Check the set, then run every slot without a run (`run_set`): ``agent`` is a
        config, its name under ``bench/agents/`` or a path to its YAML file. ``options``
        go to `run_set` (``reps``, ``accept_conditions``, ``max_attempts``, ``budget``…)."""
        if isinstance(agent, AgentConfig):
            config = agent
        elif Path(agent).suffix in (".yaml", ".yml"):
            config = load_agent(agent)
        else:
            config = find_agent(self._folder(bench, self.bench_dir, "bench"), str(agent))
        studio_dir = Path(studio) if studio is not None else self.studio_dir
        runs = self._folder(runs_dir, self.runs_dir, "runs")
        bars = _JobBars(enabled=progress)
        try:
            return run_set(
                self.store,
                set_name,
                config,
                runs_dir=runs,
                studio=studio_dir,
                runner=runner,
                arms=arms,
                progress=bars.update,
                **options,
            )
        finally:
            bars.close()

    def score(
        self,
        set_name: str,
        agents: Sequence[str] | None = None,
        *,
        n_boot: int = 1000,
        seed: int = 0,
        out: str | Path | None = None,
    ) -> ResultView:
        """Score the recorded jobs of the set (`score_jobs`), move ``results/<set>`` to the
        result, and write results.json/.parquet into ``out`` if given."""
        view = show_set(self.store, set_name)
        jobs = jobs_of(self.store, view.task_set, list(agents) if agents else None)
        scored = score_jobs(self.store, jobs, n_boot=n_boot, seed=seed, set_name=set_name)
        if out is not None:
            write_results(scored, Path(out))
        return self.result(scored.result)

    # -- proving where a score came from --------------------------------------------------------
    def _result_id(self, result: str | ObjectId | ResultView) -> ObjectId:
        return result.id if isinstance(result, ResultView) else self.result(result).id

    def provenance(self, result: str | ObjectId | ResultView, *, runs: bool = False) -> Provenance:
        """Where ``result`` came from, as ``medomni audit show`` prints it: its scores, the
        task set, every build (template, cohort, dataset release, config hash), the agents,
        served models and jobs. ``result``: a `ResultView`, or what `result` takes."""
        return provenance(self.store, self._result_id(result), runs=runs)

    def verify(
        self,
        result: str | ObjectId | ResultView,
        *,
        canonical: bool = False,
        jobs: int | None = None,
        progress: bool = True,
    ) -> VerifyReport:
        """Re-hash every object ``result`` was made from and make its answer columns again,
        as ``medomni audit verify`` does; the report names each missing, corrupt or
        malformed object with its path from the result (``ok`` when there is none)."""
        rid = self._result_id(result)
        with _bar(total=None, unit="obj", desc="verify", disable=not progress) as bar:
            return verify_result(
                self.store,
                rid,
                canonical=canonical,
                jobs=jobs,
                derived=True,
                progress=lambda n: bar.update(n - bar.n),
            )

    # -- display ---------------------------------------------------------------------------------
    def _summary(self) -> list[tuple[str, str]]:
        def folder(p: Path | None) -> str:
            return str(p) if p is not None else "-"

        counts = [
            sum(1 for _ in self.store.refs.items(prefix))
            for prefix in ("tasksets/", "runs/jobs/", "results/")
        ]
        return [
            ("store", self.url),
            ("studio", folder(self.studio_dir)),
            ("bench", folder(self.bench_dir)),
            ("runs", folder(self.runs_dir)),
            ("recorded", f"{counts[0]} task sets, {counts[1]} jobs, {counts[2]} results"),
        ]

    def __repr__(self) -> str:
        where = f" {self.root}" if self.root is not None else ""
        return f"WorkspaceView{where}\n" + "\n".join(f"  {k:<9} {v}" for k, v in self._summary())

    def _repr_html_(self) -> str:
        where = esc(self.root) if self.root is not None else ""
        items = [(k, value_html(v)) for k, v in self._summary()]
        return kv_table(items, caption=f"<b>WorkspaceView</b> {where}")


class _JobBars:
    """One progress bar per job, from `run_set`'s (job name, done, total) callbacks."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.job: str | None = None
        self.bar: Any = None

    def update(self, job: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if job != self.job:
            self.close()
            parts = job.split("--")
            label = parts[2] if len(parts) > 2 else job
            self.bar = _bar(total=total, unit="run", desc=label)
            self.job = job
        self.bar.update(done - self.bar.n)  # tqdm redraws at most every `mininterval`

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def open_workspace(
    path_or_url: str | Path = ".",
    *,
    cache: bool | str | None = None,
    single_writer: bool = False,
) -> WorkspaceView:
    """A workspace folder (its ``workspace.yaml``: store, studio, bench, runs) or a store
    URL (``lmdb://…``, ``memory://``, ``s3://bucket/prefix?…``: a store, no folders).

    ``cache`` puts a local object cache in front of a remote store (see `open_store`)."""
    text = str(path_or_url)
    if "://" in text:
        return WorkspaceView(open_store(text, cache=cache, single_writer=single_writer))
    root = Path(text).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"no workspace folder at {root} (give a folder or a store URL)")
    ws = load_workspace(root)
    store = open_store(ws.store_url, cache=cache, single_writer=single_writer)
    return WorkspaceView(
        store, root=ws.root, studio_dir=ws.studio, bench_dir=ws.bench, runs_dir=ws.runs
    )
