"""Paired contrasts between arms (``medomni bench compare``), checked against a computation
written here from the prediction records and the answer keys, with numpy and scipy directly.

One small world per module (`tests._compare_world`): two n20 pairs (a class target scored
by macro F1, a numeric one by MAE) under no-perception and encoders (two repetitions each)
and the six rungs of the modality ladder (one each), run by an in-process agent; a second
set of the same pairs (another task set hash) has one job too.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.stats  # type: ignore[import-untyped]

import medomni_cas as mc
from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.confusion import confusion_tables
from medomni_cas.bench.contrasts import (
    CompareError,
    Contrast,
    default_contrasts,
    derive_comparison,
    rows_table,
)
from medomni_cas.bench.paired_stats import holm
from medomni_cas.bench.records import JobRecord, PredictionRecord, RunRecord
from medomni_cas.bench.refnames import EVIDENCE_REFS, comparison_ref, evidence_ref
from medomni_cas.bench.scorer import jobs_of, score_jobs
from medomni_cas.cli import main
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import (
    AnswerKey,
    AtomTask,
    BuildConfig,
    BuildResult,
    Content,
    SetBuild,
)
from medomni_cas.studio.tasksets import show_set
from tests._compare_world import SET, make_world

OTHER = "medomni-bench/other"
N_BOOT = 200


@dataclass(frozen=True)
class World:
    url: str
    out: Path
    data: dict[str, Any]  # `bench compare --json`
    code: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("compare")
    url = make_world(root, other=OTHER)
    out = root / "results"
    args = ["bench", "compare", SET, "--store", url, "--out", str(out), "--n-boot", str(N_BOOT)]
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        code = main([*args, "--json"])
    return World(url, out, json.loads(sink.getvalue()), code)


@pytest.fixture
def store(world: World) -> Iterator[mc.Store]:
    s = mc.open(world.url, create=False)
    yield s
    s.close()


# -- the independent computation ---------------------------------------------------------------
@dataclass
class Side:
    """Per patient, per repetition: (answer, truth) of one target under one arm."""

    rows: dict[str, list[tuple[object, object]]]


def _sides(store: mc.Store) -> tuple[dict[tuple[str, str, str], Side], dict[str, Any]]:
    """(arm label, pair, target) -> Side, from the runs' prediction records and the answer
    keys; and each pair's cohort order, metric per target, and evidence per (label, patient)."""
    view = show_set(store, SET)
    assert view.build is not None
    entries = store.get(view.build, SetBuild).entries
    keys, metrics, order, families = {}, {}, {}, {}
    for e in entries:
        br = store.get(e.result, BuildResult)
        keys[(e.pair, arm_label(e.arm, e.arm_variant))] = store.get(br.answer_key, AnswerKey)
        order[e.pair] = store.get(br.content, Content).patients
        cfg = store.get(e.config, BuildConfig)
        for t in cfg.targets:
            metrics[(e.pair, t["label"])] = t["metric"]
        families[arm_label(e.arm, e.arm_variant)] = list(cfg.arm_definition["families"])
    sides: dict[tuple[str, str, str], Side] = {}
    evidence: dict[tuple[str, str, str], ObjectId] = {}
    for jid in jobs_of(store, view.task_set):
        job = store.get(jid, JobRecord)
        label = arm_label(job.arm, job.arm_variant)
        for _, run in store.get_many(job.runs, RunRecord):
            atom = store.get(run.atom, AtomTask)
            evidence[(label, run.pair, atom.patient)] = atom.evidence
            given = {}
            if run.outcome == "answered" and run.agent_block.meets_arm:
                for _, p in store.get_many(run.predictions, PredictionRecord):
                    given[p.target] = p.value
            truth = keys[(run.pair, label)].values[atom.patient]
            for target, value in truth.items():
                side = sides.setdefault((label, run.pair, target), Side({}))
                side.rows.setdefault(atom.patient, []).append((given.get(target), value))
    return sides, {"metrics": metrics, "order": order, "evidence": evidence, "families": families}


def _macro_f1(rows: list[tuple[object, object]]) -> float:
    truth = [t for _, t in rows]
    pred = [p for p, _ in rows]
    classes = sorted({str(t) for t in truth} | {str(p) for p in pred if p is not None})
    f1 = []
    for c in classes:
        tp = sum(1 for p, t in rows if p == c and t == c)
        fp = sum(1 for p, t in rows if p == c and t != c)
        fn = sum(1 for p, t in rows if t == c and p != c)
        if 2 * tp + fp + fn:
            f1.append(2 * tp / (2 * tp + fp + fn))
    return sum(f1) / len(f1)


def _mae(rows: list[tuple[object, object]]) -> float:
    errs = [abs(float(p) - float(t)) for p, t in rows if p is not None]  # type: ignore[arg-type]
    return sum(errs) / len(errs) if errs else math.nan


METRIC = {"macro_f1": _macro_f1, "mae": _mae}


def _expected(sides: dict[tuple[str, str, str], Side], facts: dict[str, Any], row: dict[str, Any]):
    a = sides[(row["a"], row["pair"], row["target"])].rows
    b = sides[(row["b"], row["pair"], row["target"])].rows
    metric = METRIC[facts["metrics"][(row["pair"], row["target"])]]
    patients = [p for p in facts["order"][row["pair"]] if p in a and p in b]
    value_a = metric([r for p in patients for r in a[p]])
    value_b = metric([r for p in patients for r in b[p]])
    # the bootstrap: resample patients (the same resample for both arms), every repetition
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(patients), size=(N_BOOT, len(patients)), dtype=np.uint32)
    diffs = []
    for draw in idx:
        ra = [r for i in draw for r in a[patients[i]]]
        rb = [r for i in draw for r in b[patients[i]]]
        diffs.append(metric(ra) - metric(rb))
    d = np.array(diffs)
    lo, hi = np.percentile(d[np.isfinite(d)], [2.5, 97.5])
    # the paired test on per-patient values
    numeric = metric is _mae
    if numeric:
        pa_ = np.array([_mae(a[p]) for p in patients])
        pb_ = np.array([_mae(b[p]) for p in patients])
    else:
        pa_ = np.array([np.mean([x == t for x, t in a[p]]) for p in patients])
        pb_ = np.array([np.mean([x == t for x, t in b[p]]) for p in patients])
    both = np.isfinite(pa_) & np.isfinite(pb_)
    gain = (pb_ - pa_ if numeric else pa_ - pb_)[both]
    single = all(len(a[p]) == 1 and len(b[p]) == 1 for p in patients)
    if not numeric and single:
        k, n = int((gain > 0).sum()), int((gain != 0).sum())
        test, p = "mcnemar-exact", scipy.stats.binomtest(k, n, 0.5).pvalue if n else 1.0
    else:
        test, p = "wilcoxon", scipy.stats.wilcoxon(pa_[both] - pb_[both]).pvalue
    return {
        "value_a": value_a,
        "value_b": value_b,
        "difference": value_a - value_b,
        "ci_low": lo,
        "ci_high": hi,
        "patients": len(patients),
        "test": test,
        "p_value": p,
        "discordant": int((gain != 0).sum()),
        "a_better": int((gain > 0).sum()),
        "b_better": int((gain < 0).sum()),
        "reps_a": len(a[patients[0]]),
        "reps_b": len(b[patients[0]]),
        "families_a": facts["families"][row["a"]],
    }


# -- the tests ---------------------------------------------------------------------------------
def test_the_default_contrasts(world: World) -> None:
    assert world.code == 0
    got = list(dict.fromkeys((r["a"], r["b"]) for r in world.data["rows"]))
    lad = [f"modality-ladder.r{i}" for i in range(1, 7)]
    want = [("encoders", "no-perception")]
    want += [(lad[i], lad[i - 1]) for i in range(1, 6)]
    want += [(lad[i], lad[0]) for i in range(2, 6)]
    assert got == want
    assert {r["kind"] for r in world.data["rows"][:2]} == {"arms"}
    assert {r["kind"] for r in world.data["rows"][2:]} == {"ladder"}
    # the other defaults, of arms this world does not run
    every = ["no-perception", "encoders", "encoders-required", "modality-ladder.r1"]
    assert default_contrasts(every)[:2] == [
        Contrast("encoders", "no-perception"),
        Contrast("encoders-required", "encoders"),
    ]


def test_every_number_matches_an_independent_computation(world: World, store: mc.Store) -> None:
    sides, facts = _sides(store)
    rows = world.data["rows"]
    assert len(rows) == 20
    for row in rows:
        want = _expected(sides, facts, row)
        name = f"{row['a']} - {row['b']} {row['pair']} {row['target']}"
        for field, value in want.items():
            got = row[field]
            if isinstance(value, float | np.floating):
                assert got == pytest.approx(float(value), rel=1e-9, abs=1e-12), (name, field)
            else:
                assert got == value, (name, field)
        assert row["excluded"] == 0 and row["excluded_why"] == {}
    # both kinds of test ran: McNemar on the ladder (one repetition), Wilcoxon otherwise
    assert {r["test"] for r in rows} == {"mcnemar-exact", "wilcoxon"}
    # Holm over the whole comparison, computed here from the raw p-values
    p = np.array([r["p_value"] for r in rows])
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate(np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order]))
    want_holm = np.empty_like(p)
    want_holm[order] = adjusted
    assert [r["p_holm"] for r in rows] == pytest.approx(list(want_holm), rel=1e-12)


def test_holm() -> None:
    assert holm([0.01, 0.04, 0.03, None, 0.5]) == pytest.approx([0.04, 0.09, 0.09, None, 0.5])
    assert holm([0.6, 0.5]) == [1.0, 1.0]
    assert holm([]) == []


def test_the_values_are_the_scorers(world: World, store: mc.Store) -> None:
    """With one repetition and every patient paired, an arm's value is its score row's."""
    view = show_set(store, SET)
    ladder = [j for j in jobs_of(store, view.task_set) if store.get(j, JobRecord).arm_variant]
    scored = score_jobs(store, ladder, n_boot=0, allow_partial=True)
    by = {(arm_label(r.arm, r.arm_variant), r.pair, r.metric): r.value for r in scored.record.rows}
    for row in world.data["rows"]:
        if row["kind"] == "ladder":
            assert row["value_a"] == pytest.approx(by[(row["a"], row["pair"], row["metric"])])


def test_pairing_excludes_what_is_not_the_same_evidence(store: mc.Store) -> None:
    """r3 stages fewer families than encoders: no patient has the same evidence under both,
    so none is paired, and each is counted; r6 stages every family: all are."""
    ts = show_set(store, SET).task_set
    jobs = jobs_of(store, ts)
    d = derive_comparison(store, jobs, contrasts=[("modality-ladder.r3", "encoders")], n_boot=50)
    assert len(d.rows) == 2
    for r in d.rows:
        assert r.kind == "arms" and r.patients == 0 and r.excluded == 20
        assert r.excluded_why == {"evidence differs": 20}
        assert r.difference is None and r.ci_low is None and r.p_value is None
    d = derive_comparison(store, jobs, contrasts=[("modality-ladder.r6", "encoders")], n_boot=50)
    assert [r.patients for r in d.rows] == [20, 20] and not any(r.excluded for r in d.rows)


def test_jobs_of_two_task_sets_are_refused(world: World, store: mc.Store) -> None:
    ts, other = show_set(store, SET).task_set, show_set(store, OTHER).task_set
    jobs = jobs_of(store, ts) + jobs_of(store, other)
    with pytest.raises(CompareError) as e:
        derive_comparison(store, jobs, n_boot=10)
    assert ts.hex() in str(e.value) and other.hex() in str(e.value)


def test_the_results_files_and_plots(world: World) -> None:
    files = {Path(f).name for f in world.data["files"]}
    confusion = "confusion--baseline--synth-ehr_ckd-staging_n20--ckd_stage"
    assert files == {
        "comparisons.json",
        "comparisons.parquet",
        "forest.png",
        "forest.svg",
        "ladder.png",
        "ladder.svg",
        f"{confusion}.png",
        f"{confusion}.svg",
    }
    doc = json.loads((world.out / "comparisons.json").read_text())
    assert doc["comparison"] == world.data["comparison"] and doc["rows"] == world.data["rows"]
    table = pq.read_table(world.out / "comparisons.parquet")
    assert table.num_rows == len(doc["rows"])
    meta = table.schema.metadata
    assert meta[b"medomni.comparison"].decode() == doc["comparison"]
    for name in ("forest", "ladder", confusion):
        assert (world.out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        root = ET.parse(world.out / f"{name}.svg").getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_the_comparison_is_stored_under_its_ref(world: World, store: mc.Store) -> None:
    cid = store.refs.get(comparison_ref(SET))
    assert cid is not None and cid.hex() == world.data["comparison"]
    c = store.get(cid, Comparison)
    assert len(c.jobs) == 10  # two arms x two repetitions, six rungs
    assert rows_table(c.rows).equals(pq.read_table(io.BytesIO(store.read_blob(c.table))))


# -- audit -----------------------------------------------------------------------------------
def _verify(capsys: pytest.CaptureFixture[str], url: str, spec: str) -> tuple[int, dict[str, Any]]:
    code = main(["audit", "verify", spec, "--store", url, "--json"])
    return code, json.loads(capsys.readouterr()[0])


def _forge(store: mc.Store, world: World, **changes: Any) -> str:
    honest = store.get(ObjectId.from_hex(world.data["comparison"]), Comparison)
    forged = msgspec.structs.replace(honest, **changes)
    sink = io.BytesIO()
    pq.write_table(rows_table(forged.rows), sink)
    forged = msgspec.structs.replace(forged, table=store.put_blob(sink.getvalue()))
    return store.put(forged).hex()


def test_audit_show_and_verify_reach_the_comparison(
    capsys: pytest.CaptureFixture[str], world: World
) -> None:
    ref = comparison_ref(SET)
    assert main(["audit", "show", ref, "--store", world.url]) == 0
    out = capsys.readouterr()[0]
    assert "encoders - no-perception" in out and world.data["comparison"] in out
    code, report = _verify(capsys, world.url, ref)
    assert code == 0, report
    assert report["ok"] and report["rows"] == 20 and report["jobs_scored"] == 10
    # the text names what was verified: a comparison and its contrasts, not a score
    assert main(["audit", "verify", ref, "--store", world.url]) == 0
    out = capsys.readouterr()[0]
    assert out.startswith(f"comparison {world.data['comparison']}: ok"), out
    assert "20 contrasts compared with the contrasts of 10 job(s) compared again" in out
    assert "score rows" not in out and "result" not in out


def test_a_forged_difference_fails_verify(
    capsys: pytest.CaptureFixture[str], world: World, store: mc.Store
) -> None:
    honest = store.get(ObjectId.from_hex(world.data["comparison"]), Comparison)
    rows = list(honest.rows)
    rows[0] = msgspec.structs.replace(rows[0], difference=0.5, p_holm=0.001)
    forged = _forge(store, world, rows=tuple(rows))
    code, report = _verify(capsys, world.url, forged)
    assert code == 1 and not report["ok"]
    messages = [p["message"] for p in report["score"]]
    assert any("difference is 0.5" in m for m in messages), messages
    assert any("p_holm is 0.001" in m for m in messages), messages
    assert all(p["row"].startswith("baseline encoders - no-perception") for p in report["score"])


def test_a_forged_seed_and_a_dropped_job_fail_verify(
    capsys: pytest.CaptureFixture[str], world: World, store: mc.Store
) -> None:
    honest = store.get(ObjectId.from_hex(world.data["comparison"]), Comparison)
    code, report = _verify(capsys, world.url, _forge(store, world, seed=1))
    assert code == 1 and any(p["field"] == "ci_low" for p in report["score"])
    dropped = _forge(store, world, jobs=honest.jobs[1:])
    code, report = _verify(capsys, world.url, dropped)
    assert code == 1
    messages = [p["message"] for p in report["score"]]
    assert any("not in the comparison" in m for m in messages), messages


def test_a_forged_task_set_fails_verify(
    capsys: pytest.CaptureFixture[str], world: World, store: mc.Store
) -> None:
    other = show_set(store, OTHER).task_set
    code, report = _verify(capsys, world.url, _forge(store, world, task_set=other))
    assert code == 1
    assert any(p["field"] == "task_set" for p in report["score"]), report["score"]


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str], world: World, tmp_path: Path) -> None:
    base = ["bench", "compare", SET, "--store", world.url, "--out", str(tmp_path)]
    assert main([*base, "--arms", "encoders", "nope"]) == 2
    assert "no arm 'nope'" in capsys.readouterr()[1]
    assert main([*base, "--arms", "encoders", "encoders"]) == 2
    assert main([*base, "--agent", "nobody"]) == 2
    assert main(["bench", "compare", "medomni-bench/none", "--store", world.url]) == 2
    capsys.readouterr()
    code = main([*base, "--arms", "encoders", "no-perception", "--n-boot", "20", "--no-plots"])
    assert code == 0
    out = capsys.readouterr()[0]
    assert "encoders - no-perception" in out and "ladder" not in out
    assert not (tmp_path / "forest.png").exists()


def test_confusion_tables(world: World, store: mc.Store) -> None:
    """Each arm's confusion of the class target, pooled over repetitions, is the count of
    (truth, answer) over its prediction records."""
    sides, _ = _sides(store)
    jobs = jobs_of(store, show_set(store, SET).task_set)
    tables = {(t.arm, t.pair): t for t in confusion_tables(store, jobs)}
    assert len(tables) == 8  # two arms and six rungs, one class target
    for (label, pair, target), side in sides.items():
        if target != "ckd_stage":
            continue
        t = tables[(label, pair)]
        want = np.zeros((len(t.classes), len(t.classes) + 1), dtype=int)
        for rows in side.rows.values():
            for answer, truth in rows:
                col = len(t.classes) if answer is None else t.classes.index(str(answer))
                want[t.classes.index(str(truth)), col] += 1
        assert t.matrix == want.tolist(), (label, pair)


def test_score_writes_confusion_plots_when_asked(
    capsys: pytest.CaptureFixture[str], world: World, tmp_path: Path
) -> None:
    args = ["bench", "score", SET, "--store", world.url, "--out", str(tmp_path), "--n-boot", "0"]
    assert main([*args, "--arm", "no-perception", "--arm", "encoders", "--plots"]) == 0
    made = {p.name for p in tmp_path.iterdir()}
    stem = "confusion--baseline--synth-ehr_ckd-staging_n20--ckd_stage"
    assert made == {"results.json", "results.parquet", f"{stem}.png", f"{stem}.svg"}
    assert f"{stem}.png" in capsys.readouterr()[0]


def test_the_harness_keeps_each_builds_evidence_column(store: mc.Store) -> None:
    """`bench run` keeps each build's evidence ids (in atom order) for the comparer, so the
    first compare of a set reads no atom; the column is the atoms' own."""
    view = show_set(store, SET)
    assert view.build is not None
    entries = store.get(view.build, SetBuild).entries
    assert entries
    for e in entries:
        result = store.get(e.result, BuildResult)
        kept = store.refs.get(evidence_ref(e.result))
        assert kept is not None, e.pair
        atoms = dict(store.get_many(result.atoms, AtomTask))
        assert store.read_blob(kept) == b"".join(atoms[a].evidence for a in result.atoms)


def test_a_forged_evidence_column_fails_verify(
    capsys: pytest.CaptureFixture[str], world: World, tmp_path: Path
) -> None:
    """The kept column is a cache: a compare that trusted a forged one (every atom's
    evidence made another, so no patient pairs) is found by `audit verify`, which reads the
    atoms themselves."""
    copy = tmp_path / "store"
    shutil.copytree(world.url.removeprefix("lmdb://"), copy)
    url = f"lmdb://{copy}"
    with mc.open(url) as s:
        for name, blob in s.refs.items(EVIDENCE_REFS):
            data = s.read_blob(blob)
            forged = s.put_blob(os.urandom(len(data)))
            s.refs.set(name, forged, expected=blob, message="forged")
    args = ["bench", "compare", SET, "--store", url, "--out", str(tmp_path / "out"), "--json"]
    assert main([*args, "--n-boot", str(N_BOOT)]) == 0
    comparison = json.loads(capsys.readouterr()[0])["comparison"]
    assert comparison != world.data["comparison"]  # the forged pairing was used
    code, report = _verify(capsys, url, comparison)
    assert code == 1 and not report["ok"], report
