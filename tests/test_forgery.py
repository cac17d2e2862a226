"""Forged results: ``medomni audit verify`` re-derives the score and names what was forged.

One small set is built, run by the baseline agent (a real subprocess per trial, two
repetitions, so the result has two jobs) and scored once per module; a second set of the
same pair is built and run too (its slots are the first set's, so nothing runs again), for
a job of another task set to swap in. Each test forges one thing the way an attacker would
with the store's own API: a new `Result` (its Parquet table made to agree with its forged
rows) put in the store and moved under ``results/<set>``, then runs the CLI's verify on the
set name. ``audit diff`` is tested here too, on the honest result and a forged one.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

import medomni_cas as mc
from medomni_cas.audit.rederive import ROW_FIELDS
from medomni_cas.bench.agents import find_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.records import JobRecord, Result, ScoreRow
from medomni_cas.bench.refnames import result_ref
from medomni_cas.bench.scorer import (
    SCORER_VERSION,
    SCORER_VERSIONS,
    jobs_of,
    rows_table,
    score_jobs,
)
from medomni_cas.cli import main
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.tasksets import build_set, show_set
from tests._sets import small_tree

SET = "medomni-bench/small"
OTHER = "medomni-bench/other"
CKD = "synth-ehr_ckd-staging@n20"
NOP, ENC = "no-perception", "encoders"


@dataclass(frozen=True)
class Scored:
    url: str
    result: str  # the honest result of SET
    task_set: str
    other_task_set: str
    other_job: str  # the other set's job (baseline, no-perception, rep 1)


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Scored:
    root = tmp_path_factory.mktemp("forgery")
    tree = small_tree(root, arms=[NOP, ENC], pairs=(CKD,))
    other = tree / "bench/benchmarks/medomni-bench/sets/other.yaml"
    other.write_text((tree / "bench/benchmarks/medomni-bench/sets/small.yaml").read_text())
    url = f"lmdb://{root / 'store'}"
    agent = find_agent(tree / "bench", "baseline")
    runs = {"runs_dir": root / "runs", "studio": tree / "studio"}
    with mc.open(url) as store:
        for name in (SET, OTHER):
            build_set(store, name, studio=tree / "studio", bench=tree / "bench")
        run_set(store, SET, agent, **runs, reps=2, arms=[NOP])
        run_set(store, SET, agent, **runs, arms=[ENC])  # recorded, and not scored
        run_set(store, OTHER, agent, **runs, arms=[NOP])  # the same slots: nothing runs
        ts, other_ts = show_set(store, SET).task_set, show_set(store, OTHER).task_set
        assert ts != other_ts
        jobs = [j for j in jobs_of(store, ts) if store.get(j, JobRecord).arm == NOP]
        result = score_jobs(store, jobs, n_boot=100, set_name=SET, arms=[NOP])
        assert len(result.record.jobs) == 2 and result.record.rows
        assert result.record.arms == (NOP,)
        (other_job,) = jobs_of(store, other_ts)
    return Scored(url, result.result.hex(), ts.hex(), other_ts.hex(), other_job.hex())


@pytest.fixture
def store(scored: Scored) -> Iterator[mc.Store]:
    s = mc.open(scored.url, create=False)
    yield s
    s.close()


def _forge(store: mc.Store, scored: Scored, **changes: Any) -> str:
    """A copy of the honest result with ``changes``, its table made from its rows, stored
    and moved under ``results/<set>``, as a careful forger would."""
    honest = store.get(ObjectId.from_hex(scored.result), Result)
    forged = msgspec.structs.replace(honest, **changes)
    sink = io.BytesIO()
    pq.write_table(rows_table(forged.rows), sink, compression="zstd")
    forged = msgspec.structs.replace(forged, table=store.put_blob(sink.getvalue()))
    rid = store.put(forged)
    store.refs.set(result_ref(SET), rid)
    return rid.hex()


def _honest(store: mc.Store, scored: Scored) -> Result:
    store.refs.set(result_ref(SET), ObjectId.from_hex(scored.result))
    return store.get(ObjectId.from_hex(scored.result), Result)


def _verify(capsys: pytest.CaptureFixture[str], scored: Scored) -> tuple[int, str, dict[str, Any]]:
    """``medomni audit verify <set>``: exit status, text, and the --json report."""
    code = main(["audit", "verify", SET, "--store", scored.url])
    out, _ = capsys.readouterr()
    again = main(["audit", "verify", SET, "--store", scored.url, "--json"])
    data = json.loads(capsys.readouterr()[0])
    assert again == code
    return code, out, data


def _messages(data: dict[str, Any]) -> list[str]:
    return [p["message"] for p in data.get("score", [])]


def _row_name(row: ScoreRow) -> str:
    return f"agent {row.agent}, arm {row.arm}, pair {row.pair}, target {row.target}"


def test_the_honest_result_verifies(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        _honest(store, scored)
    code, out, data = _verify(capsys, scored)
    assert code == 0, out
    assert out.startswith(f"result {scored.result}: ok")
    assert data["ok"] is True and data["score"] == [] and data["rows"] > 0


def test_a_forged_score_value(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        row = honest.rows[0]
        rows = (msgspec.structs.replace(row, value=0.99), *honest.rows[1:])
        rid = _forge(store, scored, rows=rows)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert data["result"] == rid and data["ok"] is False
    (problem,) = data["score"]
    assert problem["kind"] == "row" and problem["field"] == "value"
    assert problem["recorded"] == 0.99 and problem["derived"] == row.value
    assert _row_name(row) in problem["message"] and f"metric {row.metric}" in problem["message"]
    assert "value" in out and "0.99" in out and _row_name(row) in out


def test_a_forged_ci_bound(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        row = honest.rows[-1]
        assert row.ci_low is not None
        rows = (*honest.rows[:-1], msgspec.structs.replace(row, ci_low=row.ci_low + 0.05))
        _forge(store, scored, rows=rows)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["field"] == "ci_low" and problem["derived"] == row.ci_low
    assert _row_name(row) in problem["message"]


def test_a_forged_n(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        row = honest.rows[0]
        rows = (msgspec.structs.replace(row, n=row.n + 30), *honest.rows[1:])
        _forge(store, scored, rows=rows)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["field"] == "n" and problem["recorded"] == row.n + 30
    assert problem["derived"] == row.n


def test_a_forged_task_set_link(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        _honest(store, scored)
        _forge(store, scored, task_set=ObjectId.from_hex(scored.other_task_set))
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    links = [p for p in data["score"] if p["kind"] == "link"]
    assert any(
        p["field"] == "task_set"
        and p["recorded"] == scored.other_task_set
        and p["derived"] == scored.task_set
        for p in links
    ), data["score"]
    assert scored.other_task_set[:12] in out


def test_a_job_swapped_for_one_of_another_set(
    capsys: pytest.CaptureFixture[str], scored: Scored
) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        other = ObjectId.from_hex(scored.other_job)
        job = store.get(other, JobRecord)
        # the other set's job of the same key: same slots, the same rows
        swapped = tuple(
            other if store.get(j, JobRecord).repetition == job.repetition else j
            for j in honest.jobs
        )
        assert swapped != honest.jobs
        _forge(store, scored, jobs=swapped)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    wanted = (
        f"job {job.name} (agent baseline, arm no-perception, rep {job.repetition}) is of "
        f"task set {scored.other_task_set[:12]} ({OTHER}), not the result's task set "
        f"{scored.task_set[:12]} ({SET})"
    )
    assert any(wanted in m for m in _messages(data)), data["score"]
    # the job it replaced is recorded for the set but no longer in the result
    assert any("not in the result" in m for m in _messages(data)), data["score"]
    assert wanted in out


@pytest.mark.parametrize("with_rows", [False, True], ids=["rows-kept", "rows-dropped"])
def test_a_dropped_job(capsys: pytest.CaptureFixture[str], scored: Scored, with_rows: bool) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        records = {j: store.get(j, JobRecord) for j in honest.jobs}
        dropped = next(j for j, r in records.items() if r.repetition == 2)
        kept = tuple(j for j in honest.jobs if j != dropped)
        rows = honest.rows
        if with_rows:
            # one row per repetition of a key: drop the rows the dropped job gave, which
            # the scorer would have given without it
            from medomni_cas.bench.scorer import derive

            rows = derive(
                store, kept, n_boot=honest.n_boot, seed=honest.seed, arms=honest.arms
            ).rows
            assert len(rows) < len(honest.rows)
        _forge(store, scored, jobs=kept, rows=rows)
        name = records[dropped].name
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    wanted = f"job {name} (agent baseline, arm no-perception, rep 2)"
    dropped_msgs = [m for m in _messages(data) if wanted in m and "not in the result" in m]
    assert dropped_msgs, data["score"]
    assert wanted in out


def test_a_job_made_outside_the_harness(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    # a job record of a key of the set that no harness wrote (any field may be forged: its
    # rows are then what it gives), linked instead of the recorded one
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        job = store.get(honest.jobs[0], JobRecord)
        made = store.put(msgspec.structs.replace(job, started="2020-01-01T00:00:00.000Z"))
        _forge(store, scored, jobs=(made, *honest.jobs[1:]))
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["job"] == made.hex() and "no harness recorded it" in problem["message"]
    assert f"rep {job.repetition}" in problem["message"]


def test_forged_answer_keys_and_a_link_to_what_is_no_job(
    capsys: pytest.CaptureFixture[str], scored: Scored
) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        _forge(store, scored, answer_keys=honest.answer_keys[:0])
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["field"] == "answer_keys" and problem["recorded"] == []
    assert problem["derived"] == [k.hex() for k in honest.answer_keys]
    with mc.open(scored.url, create=False) as store:
        _forge(store, scored, jobs=(honest.answer_keys[0], *honest.jobs[1:]))
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert [p["field"] for p in data["score"]] == ["jobs[0]"], data["score"]


def test_forged_coverage(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    # scorer 1.1.0 rows say what their slots gave: a count moved, or the result's flag
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        row = honest.rows[0]
        assert row.expected == 20 and row.answered == 20 and row.task_set == scored.task_set
        moved = msgspec.structs.replace(row, answered=19, unanswered={"timeout": 1})
        _forge(store, scored, rows=(moved, *honest.rows[1:]))
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert {p["field"] for p in data["score"]} == {"answered", "unanswered"}
    with mc.open(scored.url, create=False) as store:
        _forge(store, scored, partial=True)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["kind"] == "result" and problem["field"] == "partial"


def test_a_result_that_claims_every_arm(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    # scored on no-perception (--arm); claiming every arm, it leaves out the encoders job
    with mc.open(scored.url, create=False) as store:
        _honest(store, scored)
        _forge(store, scored, arms=())
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert any(f"arm {ENC}, rep 1)" in m and "not in the result" in m for m in _messages(data)), (
        data["score"]
    )
    # and the rows a score of every arm has (the encoders job's, never run here) are missing
    assert any(f"arm {ENC}" in p["row"] for p in data["score"] if p["kind"] == "row")


def test_two_jobs_of_one_key(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        _forge(store, scored, jobs=(*honest.jobs, honest.jobs[0]))
        name = store.get(honest.jobs[0], JobRecord).name
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert any("2 jobs of one key" in m and name in m for m in _messages(data)), data["score"]


def test_a_forged_parquet_table(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        row = honest.rows[0]
        forged_rows = (msgspec.structs.replace(row, value=0.99), *honest.rows[1:])
        sink = io.BytesIO()
        pq.write_table(rows_table(forged_rows), sink)
        # the rows honest, only the table that results.parquet is made from forged
        forged = msgspec.structs.replace(honest, table=store.put_blob(sink.getvalue()))
        store.refs.set(result_ref(SET), store.put(forged))
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["kind"] == "table" and problem["field"] == "value"
    assert problem["recorded"] == 0.99 and _row_name(row) in problem["message"]


def test_an_unknown_scorer_version(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    with mc.open(scored.url, create=False) as store:
        _honest(store, scored)
        _forge(store, scored, scorer_version="9.9.9")
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["kind"] == "scorer" and "9.9.9" in problem["message"]
    with mc.open(scored.url, create=False) as store:
        _honest(store, scored)
        _forge(store, scored, scorer="someone-elses-scorer")
    code, out, data = _verify(capsys, scored)
    assert code == 1 and "someone-elses-scorer" in out


def test_forged_settings_change_the_rows(
    capsys: pytest.CaptureFixture[str], scored: Scored
) -> None:
    # a seed or n_boot the rows were not made with: the intervals differ
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        _forge(store, scored, seed=honest.seed + 1)
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    assert {p["field"] for p in data["score"]} <= {"ci_low", "ci_high"}
    assert data["score"]


# -- diff --------------------------------------------------------------------------------------
def test_diff_exits_1_when_the_results_differ(
    capsys: pytest.CaptureFixture[str], scored: Scored
) -> None:
    s = ("--store", scored.url)
    assert main(["audit", "diff", scored.result, scored.result, *s]) == 0
    assert capsys.readouterr()[0].splitlines()[-1] == "no differences"
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        forged = _forge(store, scored, seed=honest.seed + 1)
    assert main(["audit", "diff", scored.result, forged, *s]) == 1
    out = capsys.readouterr()[0]
    assert "seed" in out
    assert main(["audit", "diff", scored.result, forged, "--json", *s]) == 1
    data = json.loads(capsys.readouterr()[0])
    assert any(d["field"] == "seed" for d in data["differences"])


# -- scorer versions ---------------------------------------------------------------------------
def test_row_fields_of_every_scorer_version() -> None:
    versions = list(ROW_FIELDS)
    assert versions[0] == "1.0.0" and set(SCORER_VERSIONS) <= set(ROW_FIELDS)
    assert ROW_FIELDS[SCORER_VERSION] == ScoreRow.__struct_fields__ and SCORER_VERSION == "1.1.0"
    for old, new in itertools.pairwise(versions):
        assert ROW_FIELDS[new][: len(ROW_FIELDS[old])] == ROW_FIELDS[old]  # fields only added
    assert ROW_FIELDS["1.0.0"][-1] == "attempts"


def test_a_result_of_scorer_1_0_0(capsys: pytest.CaptureFixture[str], scored: Scored) -> None:
    """Compared on the fields 1.0.0 wrote; the fields added since must be at their defaults."""
    newer = [f for f in ScoreRow.__struct_fields__ if f not in ROW_FIELDS["1.0.0"]]
    plain = ScoreRow(agent="", arm="", pair="", target="", metric="", value=None, n=0, config="")
    with mc.open(scored.url, create=False) as store:
        honest = _honest(store, scored)
        old = tuple(
            msgspec.structs.replace(r, **{f: getattr(plain, f) for f in newer}) for r in honest.rows
        )
        _forge(store, scored, scorer_version="1.0.0", rows=old)
    code, out, _ = _verify(capsys, scored)
    assert code == 0, out
    with mc.open(scored.url, create=False) as store:
        _forge(
            store,
            scored,
            scorer_version="1.0.0",
            rows=(msgspec.structs.replace(old[0], expected=7), *old[1:]),
        )
    code, out, data = _verify(capsys, scored)
    assert code == 1, out
    (problem,) = data["score"]
    assert problem["field"] == "expected" and "scorer 1.0.0 writes no expected" in out
