"""Label recipes on small hand-made tables, plug-in recipes, and the example dataset's labels."""

from __future__ import annotations

import datetime as dt
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from examples import synth
from medomni_cas.studio import folders
from medomni_cas.studio import labels as L
from medomni_cas.studio import schema as s

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STAGES = ("G5", "G4", "G3b", "G3a", "G2", "G1")


def day(d: int, hour: int = 0) -> dt.datetime:
    return dt.datetime(2020, 1, d, hour)


@pytest.fixture
def labs() -> pa.Table:
    """Patient 1: eGFR 95, 44, 10 on days 1, 3, 5; patient 2: two eGFRs at the same time
    (59.9 then 60.0) and a null; patient 3: only an HbA1c; patient 4: a NaN eGFR."""
    rows = [
        (1, day(1), "eGFR", 95.0),
        (1, day(3), "eGFR", 44.0),
        (1, day(3), "HbA1c", 7.1),
        (1, day(5), "eGFR", 10.0),
        (2, day(2), "eGFR", 59.9),
        (2, day(2), "eGFR", 60.0),
        (2, day(4), "eGFR", None),
        (3, day(9), "HbA1c", 7.0),
        (4, day(1), "eGFR", float("nan")),
    ]
    cols = list(zip(*rows, strict=True))
    return pa.table(
        {
            "pid": pa.array(cols[0], pa.int64()),
            "time": pa.array(cols[1], pa.timestamp("ms")),
            "test": pa.array(cols[2]),
            "value": pa.array(cols[3], pa.float64()),
        }
    )


def recipe(kind: str, **fields: object) -> L.Recipe:
    body = {"recipe": kind, "name": "x", "table": "labs", "column": "value", **fields}
    return msgspec.convert(body, L.recipe_type(kind))


def ckd() -> L.Recipe:
    bins = {"edges": [15, 30, 45, 60, 90], "classes": list(STAGES)}
    return recipe("last_before", where={"test": "eGFR"}, bins=bins)


def run(r: L.Recipe, table: pa.Table, requests: list[tuple[object, object]]) -> list[L.Value]:
    return r.evaluate(table, requests, patient_key="pid", time_column="time")


# -- last_before, first_after ----------------------------------------------------------------
def test_last_before_binned(labs: pa.Table) -> None:
    requests = [
        (1, day(4)),  # last eGFR before is 44 (the HbA1c at that time does not count)
        (1, day(6)),  # 10
        (1, day(3)),  # strictly before: the day-3 eGFR is not before day 3 -> 95
        (1, day(1)),  # nothing before the first value -> None
        (2, day(3)),  # two values at one time: the last in table order, 60.0 -> G2
        (2, day(5)),  # the null on day 4 is no value: still 60.0
        (3, day(10)),  # only an HbA1c: no eGFR -> None
        (4, day(2)),  # NaN is no value -> None
        (99, day(2)),  # a patient the table does not know -> None
    ]
    assert run(ckd(), labs, requests) == ["G3b", "G5", "G1", None, "G2", "G2", None, None, None]


def test_numeric_without_bins(labs: pa.Table) -> None:
    r = recipe("last_before", where={"test": "eGFR"})
    assert r.kind == "numeric" and r.classes == ()
    values = run(r, labs, [(1, day(4)), (1, day(1)), (2, day(3))])
    assert values == [44.0, None, 60.0]
    assert all(type(v) is float for v in values if v is not None)


def test_first_after(labs: pa.Table) -> None:
    r = recipe("first_after", where={"test": "eGFR"})
    requests = [(1, day(1)), (1, day(2)), (1, day(5)), (2, day(1)), (2, day(2))]
    # strictly after; equal times in table order (59.9 first); nothing after -> None
    assert run(r, labs, requests) == [44.0, 44.0, None, 59.9, None]


def test_bin_edges_belong_to_the_class_above() -> None:
    times = [day(1)] * 8
    values = [0.0, 14.99, 15.0, 29.9, 30.0, 59.99, 60.0, 120.0]
    table = pa.table(
        {"pid": list(range(8)), "time": pa.array(times, pa.timestamp("s")), "value": values}
    )
    r = recipe("last_before", bins={"edges": [15, 30, 45, 60, 90], "classes": list(STAGES)})
    got = run(r, table, [(i, day(2)) for i in range(8)])
    assert got == ["G5", "G5", "G4", "G4", "G3b", "G3a", "G2", "G1"]


def test_string_patients_and_integer_times() -> None:
    table = pa.table({"pid": ["a", "b", "a"], "time": [10, 20, 30], "value": [1, 2, 3]})
    r = recipe("last_before")
    assert run(r, table, [("a", 31), ("a", 30), ("b", 21), ("c", 99)]) == [3.0, 1.0, 2.0, None]
    assert run(r, table, []) == []


def test_evaluation_errors_name_the_label(labs: pa.Table) -> None:
    with pytest.raises(L.LabelError, match=r"label 'x' .*no column 'result'"):
        run(recipe("last_before", column="result"), labs, [(1, day(2))])
    with pytest.raises(L.LabelError, match="column 'test' is string, not a number"):
        run(recipe("last_before", column="test"), labs, [(1, day(2))])
    with pytest.raises(L.LabelError, match="requests do not match"):
        run(ckd(), labs, [(1, "yesterday")])


# -- guards ----------------------------------------------------------------------------------
def test_guards_are_what_the_recipe_reads_plus_what_it_declares() -> None:
    creatinine = {"table": "labs", "where": {"test": "creatinine"}}
    implied = L.Guard(table="labs", column="value", where={"test": "eGFR"})
    r = recipe("last_before", where={"test": "eGFR"}, guards=[creatinine, creatinine])
    assert r.reads() == (implied,)
    assert r.all_guards() == (implied, L.Guard(table="labs", where={"test": "creatinine"}))
    ahead = recipe("first_after", where={"test": "HbA1c"})
    assert ahead.all_guards() == (
        L.Guard(table="labs", column="value", where={"test": "HbA1c"}, period="after"),
    )


def test_bins_and_guards_report_their_problems() -> None:
    bins = L.Bins(edges=(30.0, 15.0), classes=("a", "b", "b"))
    assert [f for f, _ in bins.problems()] == ["edges", "classes"]
    assert [f for f, _ in L.Guard(family="ecg", column="x").problems()] == ["family"]
    assert [f for f, _ in L.Guard(table="t", period="later").problems()] == ["period"]


# -- registry and plug-ins -------------------------------------------------------------------
@pytest.fixture
def fresh_registry() -> Iterator[None]:
    L.reset_registry()
    yield
    L.reset_registry()


def test_unknown_recipe_lists_the_known(fresh_registry: None) -> None:
    with pytest.raises(KeyError, match=r"unknown label recipe 'nope' \(known: first_after"):
        L.recipe_type("nope")


def count_rows(
    table: pa.Table, requests: list, *, patient_key: str, time_column: str, test: str
) -> list[float]:
    """A custom label: how many ``test`` results the patient had before the time."""
    rows = table.filter(pc.equal(table["test"], test))
    out = []
    for patient, t in requests:
        mine = rows.filter(pc.equal(rows[patient_key], patient))
        before = pc.less(mine[time_column], pa.scalar(t, mine.schema.field(time_column).type))
        out.append(float(pc.sum(before).as_py() or 0))
    return out


def dataset_with(tmp_path: Path, label: str) -> Path:
    src = (EXAMPLES / "studio/datasets/synth-ehr/dataset.yaml").read_text()
    folder = tmp_path / "synth-ehr"
    folder.mkdir()
    (folder / "dataset.yaml").write_text(src + textwrap.indent(textwrap.dedent(label), "  "))
    return folder


def test_function_recipe_from_a_file(tmp_path: Path, labs: pa.Table, fresh_registry: None) -> None:
    L.register("count_before", count_rows)
    folder = dataset_with(
        tmp_path,
        """
        - name: egfr_count
          recipe: count_before
          table: labs
          params: {test: eGFR}
          guards: [{table: labs, where: {test: eGFR}}]
        """,
    )
    label = folders.load_dataset(folder).label("egfr_count")
    assert isinstance(label, L.FunctionRecipe) and label.kind == "numeric"
    assert label.all_guards() == (L.Guard(table="labs", where={"test": "eGFR"}),)
    assert run(label, labs, [(1, day(4)), (2, day(1))]) == [2.0, 0.0]
    with pytest.raises(ValueError, match="already registered"):
        L.register("count_before", count_rows)


def test_function_recipe_must_declare_guards(tmp_path: Path, fresh_registry: None) -> None:
    L.register("count_before", count_rows)
    folder = dataset_with(tmp_path, "- {name: n, recipe: count_before, table: labs}\n")
    with pytest.raises(s.SpecError, match=r"labels\[2\]\.guards: a plugged-in recipe must"):
        folders.load_dataset(folder)


def test_entry_point_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None
) -> None:
    # A real installed distribution on sys.path, found through importlib.metadata.
    (tmp_path / "medomni_label_plugin.py").write_text(
        "def always_g1(table, requests, **kwargs):\n    return ['G1' for _ in requests]\n"
    )
    info = tmp_path / "medomni_label_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: medomni-label-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[medomni.labels]\nalways_g1 = medomni_label_plugin:always_g1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = L.recipe_type("always_g1")
        assert issubclass(cls, L.FunctionRecipe)
        r = msgspec.convert(
            {
                "recipe": "always_g1",
                "name": "g",
                "table": "labs",
                "classes": ["G1", "G2"],
                "guards": [{"family": "labs"}],
            },
            cls,
        )
        assert r.kind == "classification"
        table = pa.table({"pid": [1], "time": [1], "value": [1.0]})
        assert run(r, table, [(1, 2), (2, 2)]) == ["G1", "G1"]
    finally:
        sys.modules.pop("medomni_label_plugin", None)


# -- on the example dataset ------------------------------------------------------------------
def test_example_labels_on_synthetic_data(tmp_path: Path) -> None:
    synth.generate(tmp_path / "data", patients=300, seed=3)
    ds = folders.load_dataset(EXAMPLES / "studio/datasets/synth-ehr")
    table_of = {t.name: t for t in ds.tables}
    labs = L.read_table(tmp_path / table_of["labs"].file)
    enc = L.read_table(tmp_path / table_of["encounters"].file)
    # prediction time of the ckd cohorts: the day after each patient's last encounter
    last = enc.group_by("patient_id").aggregate([("time", "max")])
    requests = [
        (p, t + dt.timedelta(days=1))
        for p, t in zip(last["patient_id"].to_pylist(), last["time_max"].to_pylist(), strict=True)
    ]
    label = ds.label("ckd_stage")
    assert label is not None
    got = label.evaluate(labs, requests, patient_key=ds.patient_key, time_column="time")

    # the same answer, the slow and obvious way
    rows = [r for r in labs.to_pylist() if r["test"] == "eGFR"]
    edges = np.array([15, 30, 45, 60, 90])
    want = []
    for p, t in requests:
        prior = [r for r in rows if r["patient_id"] == p and r["time"] < t]
        if not prior:
            want.append(None)
            continue
        value = max(prior, key=lambda r: r["time"])["value"]
        want.append(STAGES[int(np.searchsorted(edges, value, side="right"))])
    assert got == want
    assert set(got) - {None} == set(STAGES)  # every class occurs: balanced cohorts are possible


def test_csv_tables_read_the_same(tmp_path: Path, labs: pa.Table) -> None:
    path = tmp_path / "labs.csv"
    path.write_text(
        "pid,time,test,value\n"
        "1,2020-01-01 00:00:00,eGFR,95\n"
        "1,2020-01-03 00:00:00,eGFR,44\n"
        "2,2020-01-02 00:00:00,eGFR,\n"
    )
    table = L.read_table(path)
    assert run(ckd(), table, [(1, day(4)), (1, day(2)), (2, day(3))]) == ["G3b", "G1", None]
    with pytest.raises(L.LabelError, match=r"\.parquet, \.csv or \.csv\.gz"):
        L.read_table(tmp_path / "labs.xlsx")


def test_function_recipe_values_are_checked(fresh_registry: None) -> None:
    cls = L.register("bad", lambda table, requests, **kw: ["G9" for _ in requests])
    r = msgspec.convert(
        {
            "recipe": "bad",
            "name": "b",
            "table": "t",
            "classes": ["G1"],
            "guards": [{"family": "f"}],
        },
        cls,
    )
    table = pa.table({"pid": [1], "time": [1], "value": [1.0]})
    with pytest.raises(L.LabelError, match=r"label 'b': recipe returned 'G9', not one of"):
        run(r, table, [(1, 2)])
