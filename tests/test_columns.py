"""Predictions and answers as columns: a job's rows line up with its arm's answers, the key
columns are shared objects, and jobs that do not line up (another order, the older one-blob
table, slots never run) score exactly the same through the join."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.columns import (
    KEY_COLUMNS,
    PREDICTION_COLUMNS,
    SLOT_COLUMNS,
    ColumnsError,
    answer_columns,
    arm_rows,
    column_bytes,
    make_answer_columns,
    put_columns,
    read_column,
    read_predictions,
)
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import (
    AnswerColumns,
    JobRecord,
    PredictionColumns,
    PredictionTable,
    ScoreRow,
)
from medomni_cas.bench.refnames import answers_ref
from medomni_cas.bench.runfolders import import_run_folder
from medomni_cas.bench.scorer import PartialScore, jobs_of, score_jobs
from medomni_cas.cli import main
from medomni_cas.errors import InvalidObject
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.verify import verify_closure
from medomni_cas.studio.records import BuildResult, SetBuild
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

SET = "medomni-bench/small"
ARM = "no-perception"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[mc.Store, Path, ObjectId]]:
    """A small set (two n20 pairs, one arm) built and run whole by the baseline agent; a
    second store where only half the slots ran."""
    root = small_tree(tmp_path_factory.mktemp("columns"), arms=[ARM])
    store = mc.open(f"lmdb://{root / 'store'}")
    build_set(store, SET, studio=root / "studio", bench=root / "bench")
    agent = find_agent(root / "bench", "baseline")
    report = run_set(store, SET, agent, runs_dir=root / "runs", studio=root / "studio")
    assert report.ran == 40
    yield store, root, report.jobs[0].job
    store.close()


def _score(store: mc.Store, job: ObjectId) -> list[ScoreRow]:
    return list(score_jobs(store, [job], n_boot=50, seed=1).record.rows)


def _job_with(store: mc.Store, job: ObjectId, predictions: ObjectId) -> ObjectId:
    record = store.get(job, JobRecord)
    return store.put(msgspec.structs.replace(record, predictions=predictions))


def test_a_job_shares_its_key_columns_with_the_answers(
    ran: tuple[mc.Store, Path, ObjectId],
) -> None:
    store, _, jid = ran
    job = store.get(jid, JobRecord)
    preds = store.get(job.predictions)
    assert isinstance(preds, PredictionColumns)
    scored = score_jobs(store, [jid], n_boot=0)
    (aid,) = scored.record.answer_columns
    answers = store.get(aid, AnswerColumns)
    assert answers.rows == preds.rows == sum(g.stop - g.start for g in answers.groups)
    for c in KEY_COLUMNS:
        assert preds.columns[c] == answers.columns[c]
    assert "truth_text" not in preds.columns and "value_text" not in answers.columns
    assert store.refs[answers_ref(job.set_build, ARM)] == aid
    # the groups are the (pair, target) row ranges, back to back
    assert [g.start for g in answers.groups[1:]] == [g.stop for g in answers.groups[:-1]]
    assert {g.pair for g in answers.groups} == {
        "synth-ehr_ckd-staging@n20",
        "synth-ehr_hba1c-next@n20",
    }
    # the notebook's table: every prediction with its run, constants from the job
    table = read_predictions(store, job)
    assert table.column_names == list(PREDICTION_COLUMNS)
    assert table.num_rows == preds.rows and set(table["arm"].to_pylist()) == {ARM}
    assert set(table["outcome"].to_pylist()) == {"answered"}


def test_jobs_that_do_not_line_up_score_the_same(ran: tuple[mc.Store, Path, ObjectId]) -> None:
    store, _, jid = ran
    job = store.get(jid, JobRecord)
    expected = _score(store, jid)
    assert all(r.n == 20 and r.value is not None for r in expected)
    table = read_predictions(store, job, extra=SLOT_COLUMNS)

    # the same rows in reverse order: no longer the key's objects, so joined
    reverse = pa.array(range(table.num_rows - 1, -1, -1))
    shuffled = table.take(reverse)
    cols = {
        c: shuffled[c].combine_chunks()
        for c in (*PREDICTION_COLUMNS, *SLOT_COLUMNS)
        if c not in ("agent", "arm")
    }
    other = store.put(PredictionColumns(rows=table.num_rows, columns=put_columns(store, cols)))
    assert (
        store.get(other, PredictionColumns).columns["atom"]
        != store.get(job.predictions, PredictionColumns).columns["atom"]
    )
    assert _score(store, _job_with(store, jid, other)) == expected

    # the layout jobs had before: one Arrow blob, which says nothing of isolation
    table = table.select(list(PREDICTION_COLUMNS))
    expected = [msgspec.structs.replace(r, isolation="") for r in expected]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    old = store.put(
        PredictionTable(
            rows=table.num_rows,
            columns=tuple(PREDICTION_COLUMNS),
            table=store.put_blob(sink.getvalue().to_pybytes()),
        )
    )
    assert _score(store, _job_with(store, jid, old)) == expected


def test_a_table_listing_an_answer_twice_is_refused(ran: tuple[mc.Store, Path, ObjectId]) -> None:
    store, _, jid = ran
    table = read_predictions(store, store.get(jid, JobRecord))
    doubled = pa.concat_tables([table, table.slice(0, 1)])
    cols = {c: doubled[c].combine_chunks() for c in ("atom", "target", "value_text", "run_id")}
    bad = store.put(PredictionColumns(rows=doubled.num_rows, columns=put_columns(store, cols)))
    with pytest.raises(mc.MedomniError, match="more than once"):
        score_jobs(store, [_job_with(store, jid, bad)], n_boot=0)


def test_slots_never_run_are_missing_answers(tmp_path: Path) -> None:
    root = small_tree(tmp_path, arms=[ARM], pairs=("synth-ehr_ckd-staging@n20",))
    with mc.open(f"lmdb://{root / 'store'}") as store:
        build_set(store, SET, studio=root / "studio", bench=root / "bench")
        agent = find_agent(root / "bench", "baseline")
        report = run_set(
            store, SET, agent, runs_dir=root / "runs", studio=root / "studio", shard=(0, 2)
        )
        ran_slots = report.ran
        assert 0 < ran_slots < 20
        job = store.get(report.jobs[0].job, JobRecord)
        preds = store.get(job.predictions, PredictionColumns)
        assert preds.rows == 20  # every atom has its row; those not run are null
        run_ids = read_column(store, preds.columns["run_id"], "run_id")
        assert run_ids.null_count == 20 - ran_slots
        assert read_predictions(store, job).num_rows == ran_slots
        jobs = jobs_of(store, job.task_set)
        with pytest.raises(PartialScore, match=f"{20 - ran_slots} of 20 slots never run"):
            score_jobs(store, jobs, n_boot=0)
        (row,) = [r for r in score_jobs(store, jobs, n_boot=0, allow_partial=True).record.rows]
        assert row.n == 20 and row.n_missing >= 20 - ran_slots
        assert row.partial and row.never_run == 20 - ran_slots and row.expected == 20


def test_column_blobs_are_checked(ran: tuple[mc.Store, Path, ObjectId]) -> None:
    store, _, _ = ran
    junk = store.put_blob(b"not an arrow stream")
    with pytest.raises(InvalidObject, match=f"blob {junk}"):
        read_column(store, junk, "value_text")
    other = store.put_blob(column_bytes("atom", pa.array(["a"])))
    with pytest.raises(InvalidObject, match="not 'value_text'"):
        read_column(store, other, "value_text")


def test_answer_columns_are_made_again_when_the_ref_is_wrong(
    ran: tuple[mc.Store, Path, ObjectId],
) -> None:
    store, _, jid = ran
    job = store.get(jid, JobRecord)
    ref = answers_ref(job.set_build, ARM)
    good, record = answer_columns(store, job.set_build, ARM)
    # a ref pointing at another arm's answers is not used
    wrong = store.put(msgspec.structs.replace(record, arm="encoders"))
    store.refs.set(ref, wrong)
    again, _ = answer_columns(store, job.set_build, ARM)
    assert again == good and store.refs[ref] == good
    # the same answers are made from scratch, byte for byte
    assert store.put(make_answer_columns(store, arm_rows(store, job.set_build, ARM))) == good


def test_a_build_whose_atoms_do_not_match_its_cohort_is_refused(
    ran: tuple[mc.Store, Path, ObjectId],
) -> None:
    store, _, _ = ran
    view = show_set(store, SET)
    sb = store.get(view.build, SetBuild)  # type: ignore[arg-type]
    entry = sb.entries[0]
    result = store.get(entry.result, BuildResult)
    short = store.put(msgspec.structs.replace(result, atoms=result.atoms[:-1]))
    bad = store.put(
        msgspec.structs.replace(
            sb, entries=(msgspec.structs.replace(entry, result=short), *sb.entries[1:])
        )
    )
    with pytest.raises(ColumnsError, match=f"build {short}.*19 atoms.*20 patients"):
        make_answer_columns(store, arm_rows(store, bad, entry.arm))
    with pytest.raises(ColumnsError, match="has no arm encoders"):
        arm_rows(store, bad, "encoders")


def test_an_imported_run_folder_scores_the_same(ran: tuple[mc.Store, Path, ObjectId]) -> None:
    store, root, jid = ran
    folder = root / "runs" / store.get(jid, JobRecord).name
    with mc.open(f"lmdb://{root / 'other'}") as other:
        build_set(other, SET, studio=root / "studio", bench=root / "bench")
        assert import_run_folder(other, folder) == jid
        assert verify_closure(other, [jid]).ok
        assert _score(other, jid) == _score(store, jid)


def test_audit_verify_makes_the_answer_columns_again(
    ran: tuple[mc.Store, Path, ObjectId], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _, jid = ran
    scored = score_jobs(store, [jid], n_boot=0)
    (aid,) = scored.record.answer_columns
    kept = store.get(aid, AnswerColumns)
    # the same result, but scored against answers with one label changed
    truth = read_column(store, kept.columns["truth_text"], "truth_text").to_pylist()
    i = next(i for i, v in enumerate(truth) if v is not None)
    truth[i] = "not-a-stage"
    doctored = msgspec.structs.replace(
        kept,
        columns={**kept.columns, **put_columns(store, {"truth_text": pa.array(truth)})},
    )
    bad = store.put(msgspec.structs.replace(scored.record, answer_columns=(store.put(doctored),)))
    url = f"lmdb://{tmp_path / 'copy'}"
    with mc.open(url) as copy:
        copy.put_raw_many(store.walk([scored.result, bad]))
    assert main(["audit", "verify", scored.result.hex(), "--store", url]) == 0
    capsys.readouterr()
    assert main(["audit", "verify", bad.hex(), "--store", url, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and not data["problems"]
    (line,) = data["derived"]
    assert "of arm no-perception are not what the answer keys give" in line
    assert "columns truth_text" in line
