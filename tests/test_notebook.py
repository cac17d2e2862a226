"""The notebook API (`medomni_cas.notebook`) on a small real flow, HTML reprs of records, and
the example notebook executed end to end by a Jupyter kernel of this interpreter."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pandas as pd
import pyarrow as pa
import pytest
import yaml

import medomni_cas as mc
from examples import synth
from medomni_cas.bench.harness import PREDICTION_COLUMNS, RunReport
from medomni_cas.bench.records import AgentConfig, Limits, RunRecord, ScoreRow
from medomni_cas.bench.schemas import ATOM_SCHEMA, RUN_SCHEMA, TASK_SET_SCHEMA
from medomni_cas.errors import MedomniError
from medomni_cas.notebook import ResultView, TaskSetView, WorkspaceView
from medomni_cas.store import encoding
from medomni_cas.studio.records import AtomTask, FormatCheck, PinnedPair, TaskSetRecord
from tests.test_verify import _tamper

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
SET = "medomni-bench/small"
SMALL = {
    "description": "The n20 pairs under one arm.",
    "builder": "medomni-v1",
    "arms": ["no-perception"],
    "pairs": [
        {"task": "synth-ehr_ckd-staging@n20", "n": 1},
        {"task": "synth-ehr_hba1c-next@n20", "n": 1},
    ],
}


@dataclass
class Flow:
    ws: WorkspaceView
    root: Path
    built: TaskSetView
    report: RunReport
    result: ResultView


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    """A workspace folder: the example studio, a copy of the example bench with a small set
    (two n20 pairs, one arm), built, run with the baseline agent and scored."""
    root = tmp_path_factory.mktemp("workspace")
    synth.generate(root / "data", patients=150, seed=0)
    shutil.copytree(EXAMPLES / "bench", root / "bench")
    (root / "bench/benchmarks/medomni-bench/sets/small.yaml").write_text(yaml.safe_dump(SMALL))
    settings = {"store": "lmdb://store", "studio": str(EXAMPLES / "studio"), "bench": "bench"}
    (root / "workspace.yaml").write_text(yaml.safe_dump(settings))
    ws = mc.open_workspace(root)
    built = ws.build(SET, data_root=root)
    report = ws.run(SET, "baseline", arms=["no-perception"])
    result = ws.score(SET, n_boot=200)
    yield Flow(ws, root, built, report, result)
    ws.close()


# -- opening ---------------------------------------------------------------------------------
def test_open_workspace_folder(flow: Flow) -> None:
    ws = flow.ws
    assert mc.open_workspace is not None and "open_workspace" in mc.__all__
    assert ws.root == flow.root.resolve()
    assert ws.studio_dir == (EXAMPLES / "studio").resolve()
    assert ws.bench_dir == flow.root.resolve() / "bench"
    assert ws.runs_dir == flow.root.resolve() / "runs"  # the default
    assert ws.url == f"lmdb://{flow.root.resolve() / 'store'}"
    assert flow.report.ran == 40 and len(flow.report.jobs) == 1
    assert any(ws.runs_dir.iterdir())  # the run folder, a view of the records


def test_open_workspace_by_url_has_no_folders(tmp_path: Path) -> None:
    with mc.open_workspace("memory://") as ws:
        assert (ws.root, ws.studio_dir, ws.bench_dir, ws.runs_dir) == (None,) * 4
        assert ws.task_sets().schema == TASK_SET_SCHEMA and ws.task_sets().num_rows == 0
        assert ws.runs().schema == RUN_SCHEMA and ws.runs().num_rows == 0
        preds = ws.predictions()
        assert preds.num_rows == 0
        assert preds.column_names == ["set", "job", "job_id", *PREDICTION_COLUMNS]
        results = ws.results()
        assert results.num_rows == 0
        fields = [
            f for f in ScoreRow.__struct_fields__ if f != "task_set"
        ]  # the result's, in front
        assert results.column_names[3:] == fields
        assert isinstance(ws.results_df(), pd.DataFrame)
        with pytest.raises(MedomniError, match="no studio folder"):
            ws.build(SET)
        with pytest.raises(MedomniError, match="no runs folder"):
            ws.run(SET, EXAMPLES / "bench/agents/baseline.yaml")
    with pytest.raises(FileNotFoundError, match="no workspace folder"):
        mc.open_workspace(tmp_path / "nowhere")


# -- tables ----------------------------------------------------------------------------------
def test_task_sets_table(flow: Flow) -> None:
    table = flow.ws.task_sets()
    assert table.schema == TASK_SET_SCHEMA
    (row,) = table.to_pylist()
    assert row == {
        "name": SET,
        "task_set": flow.built.task_set.hex(),
        "builder": "medomni-v1",
        "arms": ["no-perception"],
        "pairs": ["synth-ehr_ckd-staging@n20 (N=1)", "synth-ehr_hba1c-next@n20 (N=1)"],
        "build": flow.built.build.hex() if flow.built.build else None,
        "entries": 2,
        "built": True,
    }
    df = flow.ws.task_sets_df()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == TASK_SET_SCHEMA.names
    assert flow.ws.task_set_names() == [SET]


def test_task_set_view_and_atoms(flow: Flow) -> None:
    view = flow.ws.task_set(SET)
    assert view.task_set == flow.built.task_set and len(view.entries) == 2
    atoms = view.atoms()
    assert atoms.schema == ATOM_SCHEMA and atoms.num_rows == 40
    by_pair = atoms.group_by("pair").aggregate([("patient", "count_distinct")]).to_pylist()
    assert {r["pair"]: r["patient_count_distinct"] for r in by_pair} == {
        "synth-ehr_ckd-staging@n20": 20,
        "synth-ehr_hba1c-next@n20": 20,
    }
    configs = {e.pair: e.config.hex() for e in view.entries}
    assert all(configs[r["pair"]] == r["config"] for r in atoms.to_pylist())
    assert view.atoms_df().shape == (40, len(ATOM_SCHEMA))

    text = repr(view)
    assert text.startswith(f"TaskSetView {SET}") and view.task_set.short in text
    assert "synth-ehr_hba1c-next@n20 (N=1)" in text and "no-perception" in text
    for e in view.entries:
        assert e.config.short in text
    page = view._repr_html_()
    assert f'title="{view.task_set.hex()}">{view.task_set.short}</code>' in page
    assert f">{view.task_set.hex()}<" not in page  # full ids only in titles


def test_runs_table(flow: Flow) -> None:
    runs = flow.ws.runs(SET)
    assert runs.schema == RUN_SCHEMA
    assert runs.num_rows == 40  # one final run per atom task
    rows = runs.to_pylist()
    assert {r["outcome"] for r in rows} == {"answered"}
    assert {r["agent"] for r in rows} == {"baseline"} and {r["set"] for r in rows} == {SET}
    assert {r["atom"] for r in rows} == set(flow.built.atoms()["atom"].to_pylist())
    assert {r["job"] for r in rows} == {flow.report.jobs[0].name}
    assert all(r["attempt"] == 1 and r["meets_arm"] and r["encoder_calls"] == 0 for r in rows)
    first = flow.ws.store.get(rows[0]["record"], RunRecord)
    assert first.run_id == rows[0]["run_id"] and first.atom.hex() == rows[0]["atom"]
    assert flow.ws.runs(agent="nobody").num_rows == 0
    assert flow.ws.runs("medomni-bench/other").num_rows == 0
    assert flow.ws.runs(agent=["baseline", "x"]).num_rows == 40
    df = flow.ws.runs_df(SET, "baseline")
    assert isinstance(df, pd.DataFrame) and df.shape == (40, len(RUN_SCHEMA))


def test_predictions_table(flow: Flow) -> None:
    store = flow.ws.store
    ids = [mc.ObjectId.from_hex(a) for a in flow.built.atoms()["atom"].to_pylist()]
    atoms = dict(store.get_many(ids, AtomTask))
    targets = sum(len(store.get(a.format_check, FormatCheck).targets) for a in atoms.values())
    preds = flow.ws.predictions(SET)
    assert preds.column_names == ["set", "job", "job_id", *PREDICTION_COLUMNS]
    assert preds.num_rows == targets == 40  # atoms x targets (one target per pair here)
    assert set(preds["run_id"].to_pylist()) == set(flow.ws.runs(SET)["run_id"].to_pylist())
    df = flow.ws.predictions_df(SET)
    ckd = df[df.target == "ckd_stage"]
    assert len(ckd) == 20 and ckd.value_text.notna().all() and ckd.value_num.isna().all()
    a1c = df[df.target == "hba1c_next"]
    assert len(a1c) == 20 and a1c.value_num.notna().all()


def test_results_and_result_view(flow: Flow) -> None:
    ws, result = flow.ws, flow.result
    table = ws.results()
    assert table.num_rows == 2
    rows = [f for f in ScoreRow.__struct_fields__ if f != "task_set"]  # the result's, in front
    assert table.column_names == ["set", "result", "task_set", *rows]
    assert table["task_set"].to_pylist() == [flow.built.task_set.hex()] * 2
    assert set(table["result"].to_pylist()) == {result.id.hex()}
    assert ws.results(SET).num_rows == 2 and ws.results("medomni-bench/none").num_rows == 0
    for spec in (SET, f"results/{SET}", result.id.hex(), result.id.hex()[:12], result.id):
        assert ws.result(spec).id == result.id
    assert result.set_name == SET and result.task_set == flow.built.task_set
    assert result.df().shape == (2, len(ScoreRow.__struct_fields__))
    assert {r.metric for r in result.record.rows} == {"macro_f1", "mae"}

    text = repr(result)
    assert text.startswith(f"ResultView {result.id.short} ({SET})")
    assert "medomni-scorer" in text and "macro_f1" in text and "hba1c_next" in text
    assert flow.built.task_set.short in text
    page = result._repr_html_()
    assert f'title="{result.id.hex()}"' in page and "jobs" in page and "macro_f1" in page
    assert isinstance(ws.results_df(), pd.DataFrame)


def test_run_again_resumes(flow: Flow) -> None:
    report = flow.ws.run(SET, "baseline", arms=["no-perception"], progress=False)
    assert report.ran == 0 and report.jobs[0].skipped == 40
    assert flow.ws.runs(SET).num_rows == 40


def test_provenance_and_verify(flow: Flow, tmp_path: Path) -> None:
    ws, rid = flow.ws, flow.result.id
    prov = ws.provenance(SET)
    assert prov.result == rid.hex() and ws.provenance(flow.result) == prov
    text = repr(prov)
    assert text.startswith(f"result {rid.hex()}") and f"task set {SET}" in text
    assert prov._repr_html_().startswith("<pre>result ")
    report = ws.verify(SET, progress=False)
    assert report.ok and report.objects > 100 and not report.problems and not report.derived
    assert repr(report).startswith(f"result {rid.hex()}: ok")
    # a copy of the closure, one run's answer blob damaged
    run = ws.store.get(ws.store.resolve(ws.runs(SET)["record"][0].as_py()), RunRecord)
    assert run.answer is not None
    url = f"lmdb://{tmp_path / 'copy'}"
    with mc.open(url) as copy:
        copy.put_raw_many(ws.store.walk([rid]))
        _tamper(copy, run.answer, b"not the answer")
    with mc.open_workspace(url) as other:
        bad = other.verify(rid, progress=False)
    assert not bad.ok and [(p.kind, p.id) for p in bad.problems] == [("corrupt", run.answer.hex())]
    text = repr(bad)
    assert "1 problem(s)" in text and f"answer: object {run.answer.hex()[:12]} is corrupt" in text


def test_workspace_repr(flow: Flow) -> None:
    text = repr(flow.ws)
    assert "1 task sets, 1 jobs, 1 results" in text and flow.ws.url in text
    page = flow.ws._repr_html_()
    assert "<table" in page and "WorkspaceView" in page


def test_tables_keep_their_types(flow: Flow) -> None:
    runs = flow.ws.runs(SET)
    assert runs.schema.field("started").type == pa.timestamp("ms", tz="UTC")
    df = flow.ws.runs_df(SET)
    # no agent here reports tokens: the column stays integers, with missing values
    assert str(df.tokens_in.dtype) == "Int64" and df.tokens_in.isna().all()
    assert str(df.elapsed_ms.dtype) == "Int64" and str(df.repetition.dtype) == "Int32"
    assert isinstance(df.started.dtype, pd.DatetimeTZDtype) and str(df.started.dt.tz) == "UTC"
    assert (df.finished >= df.started).all()
    first = flow.ws.store.get(df.record[0], RunRecord)
    assert df.started[0].isoformat(timespec="milliseconds") == first.started
    assert df.errors[0] == [] and isinstance(df.errors.dtype, pd.ArrowDtype)

    atoms = flow.built.atoms_df()
    assert pd.api.types.is_datetime64_any_dtype(atoms.prediction_time)
    atom = flow.ws.store.get(mc.ObjectId.from_hex(atoms.atom[0]), AtomTask)
    assert atoms.prediction_time[0].isoformat() == atom.prediction_time
    assert atoms.families[0] == list(atom.families)

    preds = flow.ws.predictions(SET)
    assert preds.schema.field("scores").type == pa.map_(pa.string(), pa.float64())
    assert str(flow.ws.predictions_df(SET).attempt.dtype) == "Int32"
    assert str(flow.ws.results_df().n.dtype) == "Int64"


def test_stored_class_probabilities_are_a_map() -> None:
    from medomni_cas.notebook.tables import _scores_map

    column = pa.chunked_array([['{"G1":0.25,"G2":0.75}', None]])
    assert _scores_map(column).to_pylist() == [[("G1", 0.25), ("G2", 0.75)], None]


def test_progress_bars_are_text_outside_jupyter() -> None:
    from tqdm.notebook import tqdm as widget_bar

    from medomni_cas.notebook import progress_bar

    bar = progress_bar(total=2, unit="pair", desc="x")
    try:
        assert not isinstance(bar, widget_bar) and bar.total == 2
    finally:
        bar.close()


# -- HTML of stored records ------------------------------------------------------------------
def test_record_html_escapes_shortens_nests_and_truncates(flow: Flow) -> None:
    agent = AgentConfig(
        name="<b>agent</b> & co",
        kind="agent",
        agent="x",
        model="m",
        route="local",
        scaffold="process",
        served_model="none",
        limits=Limits(time_sec=5),
        options={"command": ["python", "-c", "print('<script>')"]},
    )
    before = encoding.encode(agent)
    page = agent._repr_html_()
    assert encoding.encode(agent) == before  # a method, not a field: the bytes are the same
    assert "&lt;b&gt;agent&lt;/b&gt; &amp; co" in page and "<b>agent" not in page
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert "AgentConfig" in page and "medomni.agent-config" in page
    assert repr(agent).startswith("AgentConfig(name='<b>agent</b> & co'")  # msgspec's own

    run = flow.ws.store.get(flow.ws.runs(SET)["record"][0].as_py(), RunRecord)
    page = run._repr_html_()
    full = run.atom.hex()
    assert f'<code title="{full}">{full[:12]}</code>' in page
    assert f">{full}<" not in page
    assert page.count("<table") > 1  # the agent block is a nested table
    assert f'title="{run.slot}">{run.slot[:12]}</code>-1' in page  # a run id: hex as text

    big = TaskSetRecord(
        name="b/s",
        builder="medomni-v1",
        arms=tuple(f"arm{i}" for i in range(25)),
        pairs=tuple(PinnedPair(task=f"t{i}@n20", n=1) for i in range(25)),
    )
    page = big._repr_html_()
    assert page.count("… (15 more)") == 2  # the arms and the grid of pairs
    assert "t9@n20" in page and "t10@n20" not in page


def test_record_html_rounds_numbers(flow: Flow) -> None:
    from medomni_cas.notebook.html import number_html

    record = flow.result.record
    page = record._repr_html_()
    values = [v for r in record.rows for v in (r.value, r.ci_low, r.ci_high) if v is not None]
    assert values and any(repr(v) != f"{v:.4g}" for v in values)
    for v in values:
        assert number_html(v) in page
        assert f">{v!r}<" not in page or repr(v) == f"{v:.4g}"  # the exact value: a title
    third = 2 / 3
    assert number_html(0.25) == "0.25"
    assert number_html(third) == f'<span title="{third!r}">0.6667</span>'


def test_html_of_long_text_and_result_record(flow: Flow) -> None:
    rec = msgspec.structs.replace(flow.result.record, scorer="x" * 1000)
    page = rec._repr_html_()
    assert "x" * 300 in page and "x" * 301 not in page and "(700 more characters)" in page
    assert page.count(">macro_f1<") == 1 and page.count(">metric</th>") == 1  # rows: one grid


# -- the example notebook --------------------------------------------------------------------
def test_example_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    # a kernel spec of this very interpreter, whatever "python3" means elsewhere
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    assert specs.get_kernel_spec("python3").argv[0] == sys.executable
    km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)

    path = EXAMPLES / "notebook.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)

    monkeypatch.setenv("MEDOMNI_EXAMPLES", str(EXAMPLES))
    cwd = tmp_path / "elsewhere"  # the notebook must not depend on the working directory
    cwd.mkdir()
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()

    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(
        o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
        for o in outputs
    )
    assert "ResultView" in text and "macro_f1" in text and "hba1c_next" in text
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "medomni.result" in html and "<code title=" in html  # the provenance peek
    # the arms compared: the contrasts' table and the forest plot inline (issue 16)
    assert "ComparisonView" in html and "encoders - no-perception" in html and "<svg" in html
    # build and run show their bars as widgets, not as text written to stderr
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets, "no progress widget"
    assert not any(cwd.iterdir())


def test_prepend_keeps_table_types() -> None:
    from medomni_cas.notebook.tables import prepend

    t = prepend(pa.table({"x": [1, 2]}), [("a", pa.string())], ["v"])
    assert t.column_names == ["a", "x"] and t["a"].to_pylist() == ["v", "v"]
