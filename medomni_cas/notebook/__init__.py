"""The notebook API: a workspace's task sets, runs, predictions and results as tables.

>>> import medomni_cas as mc
>>> ws = mc.open_workspace("path/to/workspace")        # or a store URL: lmdb://…, s3://…
>>> ws.build("medomni-bench/v1", data_root="path/to/data")
>>> ws.run("medomni-bench/v1", "baseline", arms=["no-perception"])
>>> ws.score("medomni-bench/v1")                        # a ResultView: shows its table
>>> ws.compare("medomni-bench/v1")                      # paired contrasts between arms, plots
>>> ws.runs_df("medomni-bench/v1").groupby("outcome").size()
>>> ws.provenance("medomni-bench/v1")                   # where the latest score came from
>>> ws.verify("medomni-bench/v1")                       # every object re-hashed: ok?

Layout
    `WorkspaceView` only calls the porcelain (`medomni_cas.porcelain`: the verbs the CLI
    calls too) and the table builders (`tables`), and wraps what they return in views
    (`views`) with text and HTML reprs (`html`).

Tables
    Every table method returns a ``pyarrow.Table`` and has a ``…_df`` twin returning a
    pandas DataFrame of the same types (pandas is imported only then). Ids in tables are
    full lowercase hex, so tables join on them (``runs`` and ``predictions`` on ``run_id``,
    ``atoms`` and ``runs`` on ``atom``); reprs show them as 12 characters.

Progress
    `build`, `run` and `verify` show progress bars (``tqdm.auto``): widgets in Jupyter,
    text bars in a terminal.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from medomni_cas import porcelain
from medomni_cas.audit.provenance import Provenance
from medomni_cas.audit.verify import VerifyReport
from medomni_cas.bench.harness import RunReport
from medomni_cas.bench.records import AgentConfig, Result
from medomni_cas.bench.refnames import JOB_REFS, RESULT_REFS, comparison_ref, result_ref
from medomni_cas.bench.runners import Runner
from medomni_cas.notebook import tables
from medomni_cas.notebook.comparison_view import ComparisonView
from medomni_cas.notebook.html import esc, kv_table, value_html
from medomni_cas.notebook.views import ResultView, TaskSetView
from medomni_cas.porcelain import Bar, Folders, Progress
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.url import open_store
from medomni_cas.studio.refnames import TASK_SET_REFS
from medomni_cas.studio.tasksets import show_set
from medomni_cas.workspace import Workspace

if TYPE_CHECKING:
    import pandas as pd

    from medomni_cas.store.sync import SyncReport

__all__ = [
    "ComparisonView",
    "ResultView",
    "TaskSetView",
    "WorkspaceView",
    "open_workspace",
    "progress_bar",
]


def progress_bar(*, total: int | None, unit: str, desc: str) -> Bar:
    """A bar of ``tqdm.auto``: a widget in Jupyter (with ipywidgets), else a text bar."""
    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)  # "IProgress not found": text it is
        from tqdm.auto import tqdm

        return tqdm(total=total, unit=unit, desc=desc)


def _progress(enabled: bool) -> Progress | None:
    return progress_bar if enabled else None


class WorkspaceView:
    """A store and, when opened from a workspace folder, its studio, bench and runs folders.

    Made by `open_workspace`. Folders are None for a store opened by URL; `build`, `run`
    and `score` then take them as arguments.
    """

    def __init__(self, store: Store, workspace: Workspace | None = None) -> None:
        self.store = store
        self.workspace = workspace
        self.folders = Folders(workspace, where=f"this workspace ({store.url})")
        self._names = tables.Names(store)

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def root(self) -> Path | None:
        return self.folders.root

    @property
    def studio_dir(self) -> Path | None:
        return self.folders.mine("studio")

    @property
    def bench_dir(self) -> Path | None:
        return self.folders.mine("bench")

    @property
    def runs_dir(self) -> Path | None:
        return self.folders.mine("runs")

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> WorkspaceView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- task sets -------------------------------------------------------------------------------
    def task_set_names(self) -> list[str]:
        refs = self.store.refs.items(TASK_SET_REFS)
        return sorted(n.removeprefix(TASK_SET_REFS) for n, _ in refs)

    def task_sets(self) -> pa.Table:
        """One row per recorded task set with its latest build: name, task set hash,
        builder, arms, pairs, entries built."""
        return tables.task_sets_table(self.store)

    def task_sets_df(self) -> pd.DataFrame:
        return tables.to_pandas(self.task_sets())

    def task_set(self, name: str) -> TaskSetView:
        """The recorded set ``<benchmark>/<set>`` and its latest build."""
        v = show_set(self.store, name)
        return TaskSetView(v.name, v.task_set, v.record, v.build, v.entries, self.store)

    # -- runs and predictions --------------------------------------------------------------------
    def _jobs(self, set_name: str | None, agent: str | Sequence[str] | None) -> list[tables.Job]:
        return tables.jobs(self.store, self._names, set_name, agent)

    def runs(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pa.Table:
        """The final run of every slot of every job (``runs/jobs/…``), one row each;
        optionally of one task set (by name: every version of it) and some agents."""
        return tables.runs_table(self.store, self._jobs(set_name, agent))

    def runs_df(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pd.DataFrame:
        return tables.to_pandas(self.runs(set_name, agent))

    def predictions(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pa.Table:
        """Every job's predictions, with the set and job in front (``scores``, the class
        probabilities an agent gave, as a map)."""
        return tables.predictions_table(self.store, self._jobs(set_name, agent))

    def predictions_df(
        self, set_name: str | None = None, agent: str | Sequence[str] | None = None
    ) -> pd.DataFrame:
        return tables.to_pandas(self.predictions(set_name, agent))

    # -- results ---------------------------------------------------------------------------------
    def results(self, set_name: str | None = None) -> pa.Table:
        """The score rows of the latest result of each set (``results/<set>``), or of one."""
        if set_name is not None:
            rid = self.store.refs.get(result_ref(set_name))
            refs = {set_name: rid} if rid is not None else {}
        else:
            refs = {
                n.removeprefix(RESULT_REFS): rid for n, rid in self.store.refs.items(RESULT_REFS)
            }
        views = [self.result(refs[name]) for name in sorted(refs)]
        return tables.results_table(
            (name, v.id, v.task_set, v.table) for name, v in zip(sorted(refs), views, strict=True)
        )

    def results_df(self, set_name: str | None = None) -> pd.DataFrame:
        return tables.to_pandas(self.results(set_name))

    def result(self, ref_or_id: str | ObjectId) -> ResultView:
        """A result by set name (its latest), ref name, id or id prefix."""
        rid = porcelain.result_id(self.store, ref_or_id)
        rec = self.store.get(rid, Result)
        table = pq.read_table(pa.BufferReader(self.store.read_blob(rec.table)))
        name = self._names.sets([rec.task_set])[rec.task_set]
        return ResultView(rid, rec, name, table)

    # -- doing things ----------------------------------------------------------------------------
    def build(
        self,
        set_name: str,
        *,
        data_root: str | Path | None = None,
        progress: bool = True,
        studio: str | Path | None = None,
        bench: str | Path | None = None,
    ) -> TaskSetView:
        """Build every pair of ``<benchmark>/<set>`` under every arm from the workspace's
        studio and bench folders; ``data_root`` is where the dataset's files are (default:
        its folder in the studio)."""
        porcelain.build(
            self.store,
            set_name,
            folders=self.folders,
            studio=studio,
            bench=bench,
            data_root=data_root,
            progress=_progress(progress),
        )
        return self.task_set(set_name)

    def run(
        self,
        set_name: str,
        agent: str | Path | AgentConfig,
        arms: Sequence[str] | None = None,
        runner: str | Runner | None = None,
        *,
        progress: bool = True,
        studio: str | Path | None = None,
        bench: str | Path | None = None,
        runs_dir: str | Path | None = None,
        **options: Any,
    ) -> RunReport:
        """Check the set, then run every slot without a run: ``agent`` is a config, its
        name under ``bench/agents/`` or a path to its YAML file. ``options`` go to
        `run_set` (``reps``, ``accept_conditions``, ``max_attempts``, ``budget``,
        ``rerun``, ``fail_fast``…). The report's ``complete`` says whether every slot
        asked for has a final run with an answer; each job's counts say where the rest are."""
        return porcelain.run(
            self.store,
            set_name,
            agent,
            folders=self.folders,
            runner=runner,
            arms=arms,
            studio=studio,
            bench=bench,
            runs_dir=runs_dir,
            progress=_progress(progress),
            **options,
        )

    def score(
        self,
        set_name: str,
        agents: Sequence[str] | None = None,
        *,
        n_boot: int = 1000,
        seed: int = 0,
        out: str | Path | None = None,
        arms: Sequence[str] | None = None,
        allow_partial: bool = False,
    ) -> ResultView:
        """Score the recorded jobs of the set (of some ``arms`` only, if given), move
        ``results/<set>`` to the result, and write results.json/.parquet into ``out`` if
        given. Raises `PartialScore` when a slot has no final run, unless ``allow_partial``
        (then the result and its rows say partial)."""
        report = porcelain.score(
            self.store,
            set_name,
            agents=agents,
            n_boot=n_boot,
            seed=seed,
            out=out,
            arms=arms,
            allow_partial=allow_partial,
        )
        return self.result(report.result)

    def compare(
        self,
        set_name: str,
        arms: Sequence[str] | None = None,
        agents: Sequence[str] | None = None,
        *,
        n_boot: int = 1000,
        seed: int = 0,
        out: str | Path | None = None,
    ) -> ComparisonView:
        """Paired contrasts between arms of the set's recorded jobs, as ``medomni bench
        compare`` makes them: ``arms`` (A, B) for A - B, else the defaults (encoders -
        no-perception, encoders-required - encoders, each ladder rung against the one
        before and against r1); stored under ``comparisons/<set>``, with
        comparisons.json/.parquet and the plots written into ``out`` if given. The view
        shows the contrasts and the plots inline."""
        report = porcelain.compare(
            self.store, set_name, arms=arms, agents=agents, n_boot=n_boot, seed=seed, out=out
        )
        return ComparisonView(report.comparison, report.compared.record, set_name)

    def comparison(self, ref_or_id: str | ObjectId) -> ComparisonView:
        """A stored comparison: by set name (its latest, ``comparisons/<set>``), ref name,
        id or id prefix."""
        spec = ref_or_id
        if isinstance(spec, str) and self.store.refs.get(comparison_ref(spec)) is not None:
            spec = comparison_ref(spec)
        found = porcelain.find_comparison(self.store, spec)
        if found is None:
            raise ValueError(f"{ref_or_id} names no comparison")
        cid, record = found
        name = self._names.sets([record.task_set])[record.task_set]
        return ComparisonView(cid, record, name)

    # -- proving where a score came from --------------------------------------------------------
    def _result_id(self, result: str | ObjectId | ResultView | ComparisonView) -> ObjectId:
        if isinstance(result, ResultView | ComparisonView):
            return result.id
        return self.result(result).id

    def provenance(self, result: str | ObjectId | ResultView, *, runs: bool = False) -> Provenance:
        """Where ``result`` came from, as ``medomni audit show`` prints it: its scores, the
        task set, every build (template, cohort, dataset release, config hash), the agents,
        served models and jobs. ``result``: a `ResultView`, or what `result` takes."""
        return porcelain.provenance(self.store, self._result_id(result), runs=runs)

    def verify(
        self,
        result: str | ObjectId | ResultView | ComparisonView,
        *,
        canonical: bool = False,
        jobs: int | None = None,
        progress: bool = True,
    ) -> VerifyReport:
        """Re-hash every object ``result`` was made from and make its answer columns again,
        as ``medomni audit verify`` does; the report names each missing, corrupt or
        malformed object with its path from the result (``ok`` when there is none). A
        `ComparisonView` is computed again from its jobs the same way."""
        return porcelain.verify(
            self.store,
            self._result_id(result),
            canonical=canonical,
            jobs=jobs,
            progress=_progress(progress),
        )

    # -- sharing ---------------------------------------------------------------------------------
    def push(
        self,
        remote: str | Store | None = None,
        refs: Sequence[str] | None = None,
        *,
        force: bool = False,
    ) -> SyncReport:
        """Send ``refs`` (default: all) and what they reach to ``remote``: a name from
        ``workspace.yaml``'s ``remotes:`` (default ``origin``), a store URL or a `Store`."""
        return porcelain.push(self.store, remote, refs, workspace=self.workspace, force=force)

    def pull(
        self,
        remote: str | Store | None = None,
        refs: Sequence[str] | None = None,
        *,
        force: bool = False,
    ) -> SyncReport:
        """Fetch ``refs`` (default: all of the remote's) and what they reach from ``remote``
        (named as for `push`)."""
        return porcelain.pull(self.store, remote, refs, workspace=self.workspace, force=force)

    # -- display ---------------------------------------------------------------------------------
    def _summary(self) -> list[tuple[str, str]]:
        def folder(p: Path | None) -> str:
            return str(p) if p is not None else "-"

        counts = [
            sum(1 for _ in self.store.refs.items(prefix))
            for prefix in (TASK_SET_REFS, JOB_REFS, RESULT_REFS)
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
    ws = Workspace.load(root)
    return WorkspaceView(ws.open_store(cache=cache, single_writer=single_writer), ws)
