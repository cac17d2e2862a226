"""The user-level verbs (build, run, score, verify, diff, push, pull, ...) for CLI and notebook.

Each verb composes Studio, Bench and Audit the one way both front ends use, and returns
what the library returns; the CLI only parses, calls a verb and prints, and the notebook's
`WorkspaceView` only calls a verb and wraps its answer in a view.

Folders
    A verb that reads the studio, the bench or the runs folder takes it as an argument;
    when none is given it uses the workspace's (`Folders`, the one place the rule is
    written). A store opened by URL has no workspace, so there the folder must be given.

Progress
    Every verb that takes a while has ``progress=``: a factory of tqdm-like bars
    (`Progress`), such as ``tqdm.tqdm`` or ``tqdm.auto.tqdm``; None shows nothing.

Results
    A verb that reads a result takes a set name (``medomni-bench/v1``: its latest score,
    the ref ``results/medomni-bench/v1``), an id, a unique prefix or a ref name
    (`result_id`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from medomni_cas.audit.diff import Difference, diff_results
from medomni_cas.audit.prov import to_prov_json
from medomni_cas.audit.provenance import Provenance
from medomni_cas.audit.provenance import provenance as audit_provenance
from medomni_cas.audit.verify import VerifyReport, verify_result
from medomni_cas.bench.agents import find_agent, load_agent
from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.contrasts import Compared, CompareError, compare_jobs, write_comparisons
from medomni_cas.bench.harness import RunReport, run_set
from medomni_cas.bench.records import AgentConfig, JobRecord
from medomni_cas.bench.refnames import result_ref
from medomni_cas.bench.runners import Runner, pick_runner
from medomni_cas.bench.scorer import Scored, ScoreError, jobs_of, score_jobs, write_results
from medomni_cas.errors import IntegrityError, InvalidName, MedomniError
from medomni_cas.store import sync
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.store.url import open_store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.benchmarks import open_benchmark, split_set_name
from medomni_cas.studio.build import Built
from medomni_cas.studio.build import build_pair as studio_build_pair
from medomni_cas.studio.folders import find_template, load_template
from medomni_cas.studio.records import BuildResult, SetBuild
from medomni_cas.studio.schema import SpecError, TaskSet
from medomni_cas.studio.tasksets import (
    RebuildRow,
    SetBuilt,
    TaskSetError,
    build_set,
    rebuild,
    show_set,
)
from medomni_cas.workspace import Workspace

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from medomni_cas.audit.attest import AttestationInfo, AttestationReport, Attested
    from medomni_cas.audit.keys import KeyPair
    from medomni_cas.store.sync import SyncProgress, SyncReport
    from medomni_cas.studio.commitments import Committed
    from medomni_cas.studio.reveal import RevealReport

__all__ = [
    "Bar",
    "CompareReport",
    "DiffReport",
    "FolderName",
    "Folders",
    "Progress",
    "ScoreReport",
    "agent_config",
    "attest",
    "attestations",
    "build",
    "build_pair",
    "check_answer_keys",
    "check_pair",
    "check_set",
    "commit_set",
    "compare",
    "diff",
    "export",
    "find_comparison",
    "format_value",
    "keygen",
    "open_remote",
    "provenance",
    "pull",
    "push",
    "rebuild_set",
    "result_id",
    "reveal_set",
    "run",
    "score",
    "verify",
    "verify_attestation",
    "verify_reveal",
    "view",
]

FolderName = Literal["studio", "bench", "runs"]


# -- progress ------------------------------------------------------------------------------------
class Bar(Protocol):
    """What a verb does with a bar (a part of tqdm's interface)."""

    n: float

    def update(self, n: float = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...


class Progress(Protocol):
    """Makes a bar: ``tqdm.tqdm``, ``tqdm.auto.tqdm`` or a partial of either is one."""

    def __call__(self, *, total: int | None, unit: str, desc: str) -> Bar: ...


class _Silent:
    """The bar of ``progress=None``: counts, shows nothing."""

    n: float = 0

    def update(self, n: float = 1) -> object:
        self.n += n
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(progress: Progress | None, total: int | None, unit: str, desc: str) -> Bar:
    return _Silent() if progress is None else progress(total=total, unit=unit, desc=desc)


def _postfix(bar: Bar) -> Callable[[str], None]:
    """A Studio ``progress`` callback that shows the message beside the bar."""
    return lambda msg: bar.set_postfix_str(msg[-60:])


def _steps(bar: Bar) -> Callable[[str], None]:
    """A Studio ``progress`` callback that shows the message and counts it as a step."""

    def say(msg: str) -> None:
        bar.set_postfix_str(msg[-60:])
        bar.update(1)

    return say


class _JobBars:
    """One bar per job, from `run_set`'s (job name, runs done, runs in the job) callbacks."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.job: str | None = None
        self.bar: Bar | None = None

    def update(self, job: str, done: int, total: int) -> None:
        if self.progress is None:
            return
        if job != self.job or self.bar is None:
            self.close()
            parts = job.split("--")  # <set>--<agent>--<arm label>--r<rep>: the arm says most
            self.bar = self.progress(
                total=total, unit="run", desc=parts[2] if len(parts) > 2 else job
            )
            self.job = job
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# -- folders -------------------------------------------------------------------------------------
class Folders:
    """The studio, bench and runs folders: the one a caller gives, else the workspace's.

    ``workspace`` may be a function that loads it, called only when a folder is not given
    (so a verb given every folder never reads ``workspace.yaml``); None: a store opened by
    URL, which has no folders. ``where`` names it in the error when a folder is missing.
    """

    def __init__(
        self,
        workspace: Workspace | Callable[[], Workspace] | None = None,
        *,
        where: str = "this store",
    ) -> None:
        self._workspace = workspace
        self.where = where

    @property
    def workspace(self) -> Workspace | None:
        if callable(self._workspace):
            self._workspace = self._workspace()
        return self._workspace

    @property
    def root(self) -> Path | None:
        ws = self.workspace
        return ws.root if ws is not None else None

    def mine(self, what: FolderName) -> Path | None:
        """The workspace's folder, or None without a workspace."""
        ws = self.workspace
        return None if ws is None else getattr(ws, what)

    def get(self, what: FolderName, given: str | Path | None = None) -> Path:
        """``given`` if there is one, else the workspace's folder; an error without either."""
        if given is not None:
            return Path(given)
        mine = self.mine(what)
        if mine is None:
            raise MedomniError(
                f"{self.where} has no {what} folder: pass {what}=, or open a "
                "workspace folder whose workspace.yaml names it"
            )
        return mine

    def optional(self, what: FolderName, given: str | Path | None = None) -> Path | None:
        """Like `get`, but None when there is neither."""
        return Path(given) if given is not None else self.mine(what)

    def results(self, set_name: str, given: str | Path | None = None) -> Path:
        """Where a score's files go: ``given``, else ``results/<benchmark>.<set>/`` in the
        workspace folder."""
        if given is not None:
            return Path(given)
        root = self.root
        if root is None:
            raise MedomniError(f"{self.where} has no workspace folder for results: pass out=")
        return root / "results" / set_name.replace("/", ".")


# -- studio --------------------------------------------------------------------------------------
def check_pair(studio: Path, pair: str) -> tuple[str, str]:
    """``<template>@<cohort>`` -> (template, cohort), both found in ``studio``."""
    template, sep, cohort = pair.partition("@")
    if not sep or not template or not cohort:
        raise ValueError(f"a pair is written <template>@<cohort>; got {pair!r}")
    path = find_template(studio, template)
    if path is None:
        raise SpecError(studio / "datasets", None, "", f"no template {template!r}")
    folder = load_template(path)
    if cohort not in folder.cohorts:
        have = ", ".join(folder.cohorts) or "none"
        raise SpecError(path / "cohorts", None, "", f"no cohort {cohort!r} ({have})")
    return template, cohort


def check_set(set_name: str, *, studio: Path, bench: Path) -> TaskSet:
    """The benchmark's set ``<benchmark>/<set>`` as its file defines it."""
    b_name, s_name = split_set_name(set_name)
    folder = open_benchmark(b_name, bench_root=bench, studio=studio)
    if s_name not in folder.sets:
        have = ", ".join(folder.sets) or "none"
        raise TaskSetError(f"benchmark {b_name} has no set {s_name!r} (have: {have})")
    return folder.sets[s_name]


def build_pair(
    store: Store,
    pair: str,
    *,
    folders: Folders,
    studio: str | Path | None = None,
    arms: Sequence[str] | None = None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
) -> list[Built]:
    """Build one pair, ``<template>@<cohort>``, under its arms (or ``arms``), outside any set."""
    studio_dir = folders.get("studio", studio)
    template, cohort = check_pair(studio_dir, pair)
    bar = _bar(progress, None, "step", pair)
    try:
        return studio_build_pair(
            store,
            studio_dir,
            template,
            cohort,
            arms=list(arms) if arms else None,
            data_root=data_root,
            progress=_steps(bar),
        )
    finally:
        bar.close()


def build(
    store: Store,
    set_name: str,
    *,
    folders: Folders,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
    data_root: str | Path | None = None,
    shard: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> SetBuilt | None:
    """Build every pair of ``<benchmark>/<set>`` under every arm and record the set
    (`build_set`); with ``shard=(i, n)`` build only shard i of n and record nothing (None)."""
    studio_dir, bench_dir = folders.get("studio", studio), folders.get("bench", bench)
    spec = check_set(set_name, studio=studio_dir, bench=bench_dir)
    bar = _bar(progress, len(spec.pairs), "pair", set_name)
    try:
        return build_set(
            store,
            set_name,
            studio=studio_dir,
            bench=bench_dir,
            data_root=data_root,
            progress=_postfix(bar),
            on_pair=lambda _pair, _builds: bar.update(1),
            shard=shard,
        )
    finally:
        bar.close()


def rebuild_set(
    store: Store,
    bundle: str | Path,
    *,
    folders: Folders,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
    dataset: str | Path | None = None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
) -> tuple[str, list[RebuildRow]]:
    """Build a published set from its bundle and your own data and compare ids pair by pair
    (`rebuild`): it reads your dataset's card (``dataset``, else the studio's), never a set
    file, template or bench folder (``bench`` is accepted and not read)."""
    del bench
    bar = _bar(progress, None, "step", "rebuild")
    try:
        return rebuild(
            store,
            bundle,
            studio=folders.optional("studio", studio) if dataset is None else studio,
            dataset=dataset,
            data_root=data_root,
            progress=_steps(bar),
        )
    finally:
        bar.close()


# -- bench ---------------------------------------------------------------------------------------
def agent_config(
    agent: str | Path | AgentConfig, *, folders: Folders, bench: str | Path | None = None
) -> AgentConfig:
    """An agent config as given, from its YAML file, or by name under ``bench/agents/``."""
    if isinstance(agent, AgentConfig):
        return agent
    path = Path(agent)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_agent(path)  # no bench folder needed
    return find_agent(folders.get("bench", bench), str(agent))


def run(
    store: Store,
    set_name: str,
    agent: str | Path | AgentConfig,
    *,
    folders: Folders,
    runner: str | Runner | None = None,
    runner_options: Mapping[str, str] | None = None,
    arms: Sequence[str] | None = None,
    studio: str | Path | None = None,
    bench: str | Path | None = None,
    runs_dir: str | Path | None = None,
    progress: Progress | None = None,
    **options: object,
) -> RunReport:
    """Check the set, then run every slot that has no run yet (`run_set`; running again
    resumes). ``runner`` defaults to the agent config's scaffold's (`runners.runner_for`);
    one that cannot drive the scaffold is refused (`RunnerError`). ``runner_options``
    configure a runner given by name; ``options`` go to `run_set` (``reps``,
    ``accept_conditions``, ``max_attempts``, ``budget``, ``shard``…). Raises `CheckFailed`
    with the problems when the set cannot run."""
    config = agent_config(agent, folders=folders, bench=bench)
    runner = pick_runner(config, runner, runner_options)
    runs = folders.get("runs", runs_dir)
    bars = _JobBars(progress)
    try:
        return run_set(
            store,
            set_name,
            config,
            runs_dir=runs,
            studio=folders.optional("studio", studio),
            bench=folders.optional("bench", bench),
            runner=runner,
            arms=list(arms) if arms else None,
            progress=bars.update,
            **options,  # type: ignore[arg-type]  # run_set's keywords, checked by it
        )
    finally:
        bars.close()


@dataclass(frozen=True)
class ScoreReport:
    """A stored score and the files written for it (none when no folder was asked for)."""

    scored: Scored
    files: tuple[Path, ...] = ()

    @property
    def result(self) -> ObjectId:
        return self.scored.result


def score(
    store: Store,
    set_name: str,
    *,
    agents: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    out: str | Path | None = None,
    allow_partial: bool = False,
    arms: Sequence[str] | None = None,
    plots: bool = False,
) -> ScoreReport:
    """Score the recorded jobs of the set, optionally of some agents only (`score_jobs`),
    move ``results/<set>`` to the result and write results.json/.parquet into ``out``.

    With ``plots``, also the per-class confusion of each class target (PNG and SVG,
    matplotlib: the ``compare`` extra) into ``out``. Only the jobs of the arm labels
    ``arms`` when given. Raises `PartialScore` (nothing
    written) when a slot of the set (under those arms) has no final run for an agent scored,
    unless ``allow_partial``: then the result and its rows say partial."""
    view = show_set(store, set_name)
    jobs = jobs_of(store, view.task_set, list(agents) if agents else None)
    if arms:
        have = {arm_label(e.arm, e.arm_variant) for e in view.entries}
        unknown = [a for a in arms if a not in have]
        if unknown:
            raise ScoreError(
                f"task set {set_name} has no arm {unknown[0]!r} (has: {', '.join(sorted(have))})"
            )
        chosen = set(arms)
        jobs = [
            j
            for j in jobs
            if arm_label(store.get(j, JobRecord).arm, store.get(j, JobRecord).arm_variant) in chosen
        ]
    if agents:
        ran = {store.get(store.get(j, JobRecord).agent_config, AgentConfig).name for j in jobs}
        idle = [a for a in agents if a not in ran]
        if idle:
            raise ScoreError(f"task set {set_name} has no recorded job by agent {idle[0]!r}")
    check_answer_keys(store, jobs, view.build, arms)
    scored = score_jobs(
        store,
        jobs,
        n_boot=n_boot,
        seed=seed,
        set_name=set_name,
        allow_partial=allow_partial,
        arms=tuple(arms or ()),
    )
    files = write_results(scored, Path(out)) if out is not None else ()
    if out is not None and plots:
        files = (*files, *_confusion_plots(store, jobs, Path(out)))
    return ScoreReport(scored, tuple(files))


def _confusion_plots(store: Store, jobs: Sequence[ObjectId], folder: Path) -> list[Path]:
    from medomni_cas.bench.confusion import confusion_tables
    from medomni_cas.bench.plots import confusion_plots

    return confusion_plots(confusion_tables(store, jobs), folder)


@dataclass(frozen=True)
class CompareReport:
    """A stored comparison and the files written for it (none when no folder was asked for)."""

    compared: Compared
    files: tuple[Path, ...] = ()

    @property
    def comparison(self) -> ObjectId:
        return self.compared.comparison


def compare(
    store: Store,
    set_name: str,
    *,
    arms: Sequence[str] | None = None,
    agents: Sequence[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    out: str | Path | None = None,
    plots: bool = True,
) -> CompareReport:
    """Paired contrasts between arms of the set's recorded jobs (`compare_jobs`): ``arms``
    (two arm labels, A then B: A - B) or the defaults, for ``agents`` or every agent; move
    ``comparisons/<set>`` to it and write comparisons.json/.parquet (and, with ``plots``,
    the forest, ladder and confusion plots) into ``out``."""
    view = show_set(store, set_name)
    if arms is not None and len(arms) != 2:
        raise CompareError(f"--arms takes two arm labels, A and B (A - B); got {list(arms)}")
    jobs = jobs_of(store, view.task_set, list(agents) if agents else None)
    compared = compare_jobs(
        store,
        jobs,
        contrasts=[(arms[0], arms[1])] if arms else (),
        agents=tuple(agents or ()),
        n_boot=n_boot,
        seed=seed,
        set_name=set_name,
    )
    files: tuple[Path, ...] = ()
    if out is not None:
        files = write_comparisons(compared, Path(out))
        if plots:
            from medomni_cas.bench.plots import comparison_plots

            files += tuple(comparison_plots(compared.record.rows, Path(out)))
            files += tuple(_confusion_plots(store, compared.record.jobs, Path(out)))
    return CompareReport(compared, files)


def find_comparison(store: Store, spec: str | ObjectId) -> tuple[ObjectId, Comparison] | None:
    """The comparison ``spec`` names (the ref ``comparisons/<set>``, an id, a prefix), or
    None when it names something else (a set name names its result)."""
    try:
        oid = result_id(store, spec)  # a set name is its result's, never its comparison's
    except MedomniError:
        return None
    if store.kind(oid) != Comparison.__kind__:
        return None
    return oid, store.get(oid, Comparison)


def check_answer_keys(
    store: Store,
    jobs: Sequence[ObjectId],
    latest: ObjectId | None,
    arms: Sequence[str] | None = None,
) -> None:
    """Re-hash the answer keys a score of ``jobs`` reads (of their set builds and the
    set's ``latest``, under the arm labels ``arms`` or all): `IntegrityError` naming the
    first damaged one. The scorer reads the answer columns it kept from the keys, not the
    keys, so a key damaged since would go unseen, linked from the new result."""
    builds = dict.fromkeys(store.get(j, JobRecord).set_build for j in jobs)
    if latest is not None:
        builds[latest] = None
    chosen = set(arms or ())
    keys: dict[ObjectId, str] = {}
    for build in builds:
        for e in store.get(build, SetBuild).entries:
            if not chosen or arm_label(e.arm, e.arm_variant) in chosen:
                keys.setdefault(store.get(e.result, BuildResult).answer_key, e.pair)
    for key, pair in keys.items():
        try:
            store.get_raw(key)
        except IntegrityError as e:
            e.args = (
                f"answer key {key.hex()} of {pair} is corrupt: its bytes hash to {e.got}; "
                "nothing was scored (`medomni cas fsck` lists the damage)",
            )
            raise


def format_value(v: float | None) -> str:
    """A score as the CLI and the notebook show it: three decimals, ``-`` for none."""
    return "-" if v is None else f"{v:.3f}"


# -- audit ---------------------------------------------------------------------------------------
def result_id(store: Store, spec: str | ObjectId) -> ObjectId:
    """A result by set name (its latest score, ``results/<set>``), ref name, id or prefix."""
    if isinstance(spec, ObjectId):
        return spec
    try:
        rid = store.refs.get(result_ref(spec))
    except InvalidName:  # an id, a prefix or a ref name is no set name
        rid = None
    return rid if rid is not None else store.resolve(spec)


def provenance(store: Store, result: str | ObjectId, *, runs: bool = False) -> Provenance:
    """Where a result came from: its scores, the task set, every build, the agents, served
    models and jobs (every run too with ``runs``)."""
    return audit_provenance(store, result_id(store, result), runs=runs)


def verify(
    store: Store,
    result: str | ObjectId,
    *,
    canonical: bool = False,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> VerifyReport:
    """Re-hash every object a result was made from, make its answer columns again and
    compute its score again from its jobs; the report names each missing, corrupt or
    malformed object, and each row or link that is not what the jobs give (``ok`` when
    there is none)."""
    rid = result_id(store, result)
    bar = _bar(progress, None, "obj", "verify")
    try:
        return verify_result(
            store,
            rid,
            canonical=canonical,
            jobs=jobs,
            derived=True,
            progress=lambda n: bar.update(n - bar.n),
        )
    finally:
        bar.close()


@dataclass(frozen=True)
class DiffReport:
    """Two results and which of their inputs differ (empty: the same result)."""

    a: ObjectId
    b: ObjectId
    differences: list[Difference]


def diff(
    store: Store, a: str | ObjectId, b: str | ObjectId, *, limit: int | None = 50
) -> DiffReport:
    """Which inputs of two results differ (none exactly when they are one result; the CLI
    exits 1 when there are any); ``limit``: per-patient lines per pair and kind before the
    rest are counted (None: all)."""
    ida, idb = result_id(store, a), result_id(store, b)
    return DiffReport(ida, idb, diff_results(store, ida, idb, limit=limit))


def export(store: Store, result: str | ObjectId, *, max_items: int = 10_000) -> dict[str, Any]:
    """A result's provenance as a W3C PROV-JSON document."""
    return to_prov_json(store, result_id(store, result), max_items=max_items)


# -- sharing -------------------------------------------------------------------------------------
# A remote is named as in workspace.yaml's ``remotes:`` (default ``origin``, or the only one),
# given as a store URL, or given as an open `Store`. A remote opened here is closed here; the
# local store is the caller's. The rules for which refs move are `medomni_cas.store.sync`'s.
Remote = str | Store | None


def open_remote(
    remote: Remote, workspace: Workspace | str | Path | None = ".", **options: bool
) -> AbstractContextManager[Store]:
    """The store ``remote`` names (see `Remote`); an open `Store` given is not closed here.

    ``options`` go to `medomni_cas.workspace.open_store` (``create=False`` for a source)."""
    if isinstance(remote, Store):
        return nullcontext(remote)  # the caller's: not closed here
    if remote is not None and "://" in remote:
        return open_store(remote, **options)
    if workspace is None:
        raise ValueError(
            f"no workspace to name remote {remote or 'origin'!r} in: give a store URL or a Store"
        )
    ws = workspace if isinstance(workspace, Workspace) else Workspace.load(workspace)
    return open_store(ws.remote_url(remote), **options)


def push(
    store: Store,
    remote: Remote = None,
    refs: Sequence[str] | None = None,
    *,
    workspace: Workspace | str | Path | None = ".",
    force: bool = False,
    message: str = "",
    progress: Callable[[SyncProgress], None] | None = None,
    single_writer: bool = False,
) -> SyncReport:
    """Send ``refs`` (default: all of ``store``'s) and what they reach to ``remote``.

    ``single_writer`` opens the remote allowing ref updates without conditional writes;
    ``force`` and ``message``: see `medomni_cas.store.sync.transfer`."""
    with open_remote(remote, workspace, single_writer=single_writer) as dst:
        return sync.push(store, dst, refs, force=force, message=message, progress=progress)


def pull(
    store: Store,
    remote: Remote = None,
    refs: Sequence[str] | None = None,
    *,
    workspace: Workspace | str | Path | None = ".",
    force: bool = False,
    message: str = "",
    progress: Callable[[SyncProgress], None] | None = None,
) -> SyncReport:
    """Fetch ``refs`` (default: all of the remote's) and what they reach into ``store``.

    The remote must exist: pulling from a mistyped local path is an error, not an empty
    store."""
    with open_remote(remote, workspace, create=False) as src:
        return sync.pull(store, src, refs, force=force, message=message, progress=progress)


# -- viewing -------------------------------------------------------------------------------------
def view(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    show_answer_keys: bool = False,
    ready: Callable[[str], object] | None = None,
) -> None:
    """Serve the read-only results viewer over ``store`` until interrupted (``medomni
    view``); ``ready`` gets its URL once it listens. Answer keys stay hidden unless
    ``show_answer_keys``. A host or port it cannot listen on raises `BindError` (a
    ValueError) naming it."""
    from medomni_cas.view import bind, make_app, serve
    from medomni_cas.view.contrasts import PlotCache, Warming
    from medomni_cas.view.server import allowed_hosts

    plots = PlotCache()
    app = make_app(store, show_answer_keys=show_answer_keys, hosts=allowed_hosts(host), plots=plots)
    sock = bind(host, port)
    warming = Warming(store, plots)
    try:
        serve(app, sock, ready=ready)
    finally:  # before the caller closes the store, and before the interpreter exits
        warming.stop()


# -- attestations --------------------------------------------------------------------------------
# Signed in-toto statements of results (`medomni_cas.audit.attest`); the keys are Ed25519 PEM
# files (`medomni_cas.audit.keys`), and `cryptography` is the ``attest`` extra.
def keygen(path: str | Path, *, force: bool = False) -> KeyPair:
    """Write a key pair: ``path`` (private, mode 0600) and ``path.pub``; refuses to
    overwrite either unless ``force``."""
    from medomni_cas.audit.keys import write_pair

    return write_pair(path, force=force)


def attest(
    store: Store, result: str | ObjectId, key: str | Path, *, output: str | Path | None = None
) -> Attested:
    """Verify a result, sign its in-toto statement with the private key file ``key``, store
    the attestation (``attestations/<set>/<keyid>``) and write the envelope to ``output``."""
    from medomni_cas.audit.attest import attest as audit_attest
    from medomni_cas.audit.keys import load_private

    return audit_attest(store, result, load_private(key), output=output)


def attestations(store: Store, subject: str | ObjectId) -> list[AttestationInfo]:
    """The signed attestations of a result, comparison or commitment the store holds
    (its ``attestations/`` refs)."""
    from medomni_cas.audit.attest import attestations_of

    return attestations_of(store, result_id(store, subject))


def verify_attestation(
    path: str | Path, public_key: str | Path, store: Store | None = None
) -> AttestationReport:
    """Check the envelope file ``path`` against the public key file; with ``store``, also
    that its subject is there and gives the same statement when verified again."""
    from medomni_cas.audit.attest import verify_attestation as audit_verify_attestation
    from medomni_cas.audit.keys import load_public

    return audit_verify_attestation(Path(path).read_bytes(), load_public(public_key), store)


# -- answer commitments ---------------------------------------------------------------------------
# Commit-then-reveal of a set's answers (`medomni_cas.studio.commitments`, `.reveal`).
def commit_set(store: Store, name: str) -> Committed:
    """Commit to the answers of the set's latest build (salted Merkle leaves); a build
    already committed to keeps its commitment."""
    from medomni_cas.studio.commitments import commit

    return commit(store, name)


def reveal_set(
    store: Store,
    name: str,
    output: str | Path,
    *,
    atoms: Sequence[str] | None = None,
    folders: Folders | None = None,
    studio: str | Path | None = None,
    allow_credentialed: bool = False,
) -> dict[str, Any]:
    """Write the openings (answer, salt, inclusion proof) of ``atoms`` (default: all) of
    the set's commitment to ``output``; refused for credentialed data unless
    ``allow_credentialed``. Returns the document written."""
    import json

    from medomni_cas.studio.reveal import reveal

    where = studio
    if where is None and folders is not None:
        try:
            where = folders.get("studio", None)
        except MedomniError:
            where = None  # no workspace: the set counts as credentialed
    doc = reveal(store, name, atoms=atoms, studio=where, allow_credentialed=allow_credentialed)
    Path(output).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def verify_reveal(
    store: Store, path: str | Path, *, commitment: str | ObjectId | None = None
) -> RevealReport:
    """Check a reveal file against the published commitment: ``commitment`` (an id, prefix
    or ref name in ``store``), else the one the file names, which must be in ``store``."""
    import json

    from medomni_cas.errors import NotFound
    from medomni_cas.studio.commitments import AnswerCommitment
    from medomni_cas.studio.reveal import verify_reveal as check_reveal

    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    spec = commitment if commitment is not None else (doc or {}).get("commitment")
    if not isinstance(spec, str | ObjectId) or not spec:
        raise ValueError(f"{path}: names no commitment; pass --commitment ID")
    try:
        cid = store.resolve(spec)
    except NotFound:
        raise ValueError(
            f"{path}: commitment {spec} is not in {store.url}: import the set's published "
            "bundle (medomni cas import) or pass --commitment ID"
        ) from None
    return check_reveal(doc, store.get(cid, AnswerCommitment), cid)
