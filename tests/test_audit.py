"""medomni audit: provenance, verify, diff and PROV-JSON of results from a real flow.

One flow is built once per test session (shared by xdist workers through a file lock, in an
LMDB store): the example studio and data, a set of the two n20 pairs under no-perception,
the baseline agent run by the process runner, then scored. Three more results follow, each
changing one kind of input:

* B: the CKD cohort's version raised to 1.1 and the template's statement reworded;
* C: one patient's potassium results changed in the data (evidence, not config);
* D: the replay agent instead of the baseline (agent config and runner).

Tests that damage objects work on a copy of a result's closure, never on the shared store.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import medomni_cas as mc
from medomni_cas.audit import (
    AuditError,
    Difference,
    diff_results,
    provenance,
    to_prov_json,
    verify_result,
)
from medomni_cas.audit.diff import render_text as diff_text
from medomni_cas.audit.provenance import render_text as show_text
from medomni_cas.bench.records import JobRecord, PredictionRecord, Result, RunRecord
from medomni_cas.cli import main
from medomni_cas.store import encoding
from medomni_cas.store._fast import LINK_MARK, fast_links
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.records import BuildResult, Content, SetBuild

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SET = "medomni-bench/small"
CKD = "synth-ehr_ckd-staging@n20"
HBA1C = "synth-ehr_hba1c-next@n20"
OLD_STATEMENT = "Estimate this patient's chronic kidney disease stage at the prediction time."
NEW_STATEMENT = "Assess this patient's chronic kidney disease stage at the prediction time."


@dataclass(frozen=True)
class Flow:
    url: str
    a: str  # baseline, as built from the examples
    b: str  # cohort version 1.1 + reworded statement
    c: str  # one patient's potassium changed in the data
    d: str  # the replay agent on C's build
    patient: str  # the patient whose data changed


# -- the flow ----------------------------------------------------------------------------------
def _small_bench(root: Path) -> Path:
    bench = root / "bench"
    shutil.copytree(EXAMPLES / "bench", bench)
    (bench / "benchmarks" / "medomni-bench" / "sets" / "small.yaml").write_text(
        "description: two n20 pairs, one arm (the audit tests)\n"
        "builder: medomni-v1\n"
        "arms: [no-perception]\n"
        f"pairs:\n  - {{task: {CKD}, n: 1}}\n  - {{task: {HBA1C}, n: 1}}\n"
    )
    return bench


def _edited_studio(root: Path) -> Path:
    studio = root / "studio2"
    shutil.copytree(EXAMPLES / "studio", studio, ignore=shutil.ignore_patterns("data"))
    tpl = studio / "datasets" / "synth-ehr" / "tasks" / "synth-ehr_ckd-staging"
    cohort = tpl / "cohorts" / "n20.yaml"
    cohort.write_text(cohort.read_text().replace('version: "1.0"', 'version: "1.1"'))
    template = tpl / "template.yaml"
    text = template.read_text()
    assert "Estimate this patient's" in text
    template.write_text(text.replace("Estimate this patient's", "Assess this patient's"))
    return studio


def _change_potassium(src: Path, dst: Path, patient: str) -> None:
    """A copy of the data in which one patient's potassium results are 10% higher."""
    shutil.copytree(src, dst)
    path = dst / "labs.parquet"
    t = pq.read_table(path)
    hit = pc.and_(pc.equal(t["patient_id"], int(patient)), pc.equal(t["test"], "potassium"))
    assert pc.any(hit).as_py()
    value = pc.if_else(hit, pc.round(pc.multiply(t["value"], 1.1), 1), t["value"])
    t = t.set_column(t.schema.get_field_index("value"), "value", value)
    pq.write_table(t, path)


def _score(store: mc.Store, agents: list[str] | None = None, set_name: str | None = SET) -> str:
    from medomni_cas.bench.scorer import jobs_of, score_jobs
    from medomni_cas.studio.tasksets import show_set

    view = show_set(store, SET)
    return score_jobs(
        store, jobs_of(store, view.task_set, agents), n_boot=50, set_name=set_name
    ).result.hex()


def _build_flow(root: Path) -> Flow:
    from examples import synth
    from medomni_cas.bench.agents import find_agent
    from medomni_cas.bench.harness import run_set
    from medomni_cas.studio.tasksets import build_set

    synth.generate(root / "data", patients=150, seed=0)
    bench = _small_bench(root)
    url = f"lmdb://{root}/store"
    runs = root / "runs"
    runs.mkdir()
    baseline = find_agent(bench, "baseline")
    with mc.open(url) as store:

        def build_and_run(studio: Path, data_root: Path) -> None:
            build_set(store, SET, studio=studio, bench=bench, data_root=data_root)
            run_set(store, SET, baseline, runs_dir=runs, studio=studio, arms=["no-perception"])

        build_and_run(EXAMPLES / "studio", root)
        a = _score(store)
        studio2 = _edited_studio(root)
        build_and_run(studio2, root)  # only the CKD pair's atoms changed: 20 new runs
        b = _score(store)
        sb = store.get(store.get(b, Result).set_build, SetBuild)
        ckd = next(e for e in sb.entries if e.pair == CKD)
        content = store.get(store.get(ckd.result, BuildResult).content, Content)
        patient = content.patients[0]
        (root / "data3").mkdir()
        _change_potassium(root / "data", root / "data3" / "data", patient)
        build_and_run(studio2, root / "data3")  # one patient's atoms changed: 1-2 new runs
        c = _score(store)
        replay = find_agent(bench, "replay-baseline")
        run_set(
            store,
            SET,
            replay,
            runs_dir=runs,
            studio=studio2,
            runner="replay",
            arms=["no-perception"],
        )
        d = _score(store, ["replay-baseline"], set_name=None)
    return Flow(url=url, a=a, b=b, c=c, d=d, patient=patient)


@pytest.fixture(scope="session")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    # xdist workers share the session's base folder: the first to get the lock builds
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "audit-flow"
    root.mkdir(exist_ok=True)
    done = root / "flow.json"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            built = _build_flow(root)
            done.write_bytes(msgspec.json.encode(built))
    return msgspec.json.decode(done.read_bytes(), type=Flow)


@pytest.fixture
def store(flow: Flow) -> Iterator[mc.Store]:
    s = mc.open(flow.url, create=False)
    yield s
    s.close()


def _copy_closure(src: mc.Store, root: str, dst: mc.Store) -> ObjectId:
    rid = src.resolve(root)
    dst.put_raw_many(src.walk([rid]))
    return rid


def _tamper(store: mc.Store, key: bytes, data: bytes) -> None:
    """Replace an object's stored bytes behind the store's back (no API can)."""
    b = store.backend
    if isinstance(b, MemoryBackend):
        b._objects[key] = (b._objects[key][0], data)
    elif isinstance(b, LMDBBackend):
        with b.env.begin(write=True) as txn:
            value = txn.get(key, db=b._objects)
            if value[0] == 0:  # inline: keep the 9-byte header (flag, write time)
                txn.put(key, bytes(value[:9]) + data, db=b._objects)
            else:
                b._file(key).write_bytes(data)
    else:  # pragma: no cover - the tests use the two above
        raise AssertionError(type(b))


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    bit = rng.randrange(len(out) * 8)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def _find(diffs: list[Difference], **want: Any) -> list[Difference]:
    return [d for d in diffs if all(getattr(d, k) == v for k, v in want.items())]


# -- show -------------------------------------------------------------------------------------
def test_show_names_every_input(store: mc.Store, flow: Flow) -> None:
    p = provenance(store, flow.a)
    assert p.result == flow.a and p.scorer == "medomni-scorer" and p.n_boot == 50
    assert p.task_set.name == SET and p.task_set.pairs == {CKD: 1, HBA1C: 1}
    assert p.task_set.builder == "medomni-v1" and p.task_set.arms == ["no-perception"]
    by_pair = {b.pair: b for b in p.builds}
    ckd = by_pair[CKD]
    assert (ckd.template, ckd.cohort, ckd.version) == ("synth-ehr_ckd-staging", "n20", "1.0")
    assert (ckd.dataset, ckd.dataset_release) == ("synth-ehr", "1.0.0")
    assert (ckd.builder, ckd.builder_version) == ("medomni-v1", "1.0.0")
    assert ckd.atoms == 20 and ckd.targets == ["ckd_stage"] and ckd.answer_key in p.answer_keys
    [job] = p.jobs
    assert job.agent.name == "baseline" and job.agent.served_model == "none"
    assert job.runner == "process" and job.runs == 40 and job.attempts == 40
    assert sum(job.outcomes.values()) == 40 and job.served_models == {"none": 40}
    assert job.prediction_records == job.prediction_rows == 40
    assert job.run_list is None and not p.warnings

    text = "\n".join(show_text(p))
    for needle in (
        flow.a,
        "task set medomni-bench/small",
        "synth-ehr_ckd-staging@n20  version 1.0: template synth-ehr_ckd-staging, cohort n20",
        "dataset synth-ehr 1.0.0",
        "builder medomni-v1 1.0.0, MedOmni 0.3.0",
        "agent baseline",
        "scaffold process",
        "expects served model none",
        "served models reported: none",
        "runner process; 40 runs, 40 attempts",
    ):
        assert needle in text, needle
    # a summary: no run is listed unless asked for
    assert not [line for line in text.splitlines() if line.lstrip().startswith("run ")]
    assert len(text.splitlines()) < 40


def test_show_lists_runs_on_request(store: mc.Store, flow: Flow) -> None:
    p = provenance(store, flow.c, runs=True)
    [job] = p.jobs
    assert job.run_list is not None and len(job.run_list) == 40
    assert {r.pair for r in job.run_list} == {CKD, HBA1C}
    assert flow.patient in {r.patient for r in job.run_list}
    assert len(show_text(p)) > 40
    # B: the CKD pair moved to 1.1, the other pair did not
    versions = {b.pair: b.version for b in provenance(store, flow.b).builds}
    assert versions == {CKD: "1.1", HBA1C: "1.0"}


def test_show_refuses_what_is_not_a_result(store: mc.Store, flow: Flow) -> None:
    ts = store.get(flow.a, Result).task_set
    with pytest.raises(AuditError, match="not a result"):
        provenance(store, ts)
    with pytest.raises(mc.NotFound):
        provenance(store, "results/no-such-set")
    # a ref name and a prefix both resolve
    assert provenance(store, "results/" + SET).result == flow.c
    assert provenance(store, flow.b[:10]).result == flow.b


# -- verify -----------------------------------------------------------------------------------
def test_verify_clean(store: mc.Store, flow: Flow) -> None:
    report = verify_result(store, flow.a)
    assert report.ok and report.problems == []
    assert report.objects == len(store.closure(ObjectId.from_hex(flow.a)))
    assert report.bytes > 0 and report.objects_per_sec > 0
    seen: list[int] = []
    assert verify_result(store, flow.b, canonical=True, progress=seen.append).ok
    assert seen and seen[-1] == len(store.closure(ObjectId.from_hex(flow.b)))


def test_verify_computes_every_honest_score_again(store: mc.Store, flow: Flow) -> None:
    for rid in (flow.a, flow.b, flow.c, flow.d):
        report = verify_result(store, rid, derived=True)
        assert report.ok and report.score == [], report
        assert report.rows == len(store.get(rid, Result).rows) and report.jobs_scored == 1
    # A's job was recorded again since (its key's ref has moved on to C's): a notice only
    (notice,) = verify_result(store, flow.a, derived=True).notices
    assert "earlier record" in notice and "agent baseline" in notice


def test_verify_finds_every_damaged_object(store: mc.Store, flow: Flow) -> None:
    copy = mc.open("memory://")
    rid = _copy_closure(store, flow.a, copy)
    keys = sorted(copy.backend.iter_keys())
    rng = random.Random(4)
    for key in rng.sample(keys, 25):
        good = copy.backend.get(key)
        _tamper(copy, key, _flip(good, rng))
        report = verify_result(copy, rid)
        assert not report.ok
        assert [(p.kind, p.id) for p in report.problems] == [("corrupt", key.hex())]
        problem = report.problems[0]
        assert key.hex()[:12] in problem.message and "is corrupt" in problem.message
        if key != rid:
            assert problem.path[0] == f"result {rid.hex()[:12]}"
        _tamper(copy, key, good)
    assert verify_result(copy, rid).ok


def test_verify_says_where_a_bad_object_sits(store: mc.Store, flow: Flow) -> None:
    copy = mc.open("memory://")
    rid = _copy_closure(store, flow.a, copy)
    job = copy.get(copy.get(rid, Result).jobs[0], JobRecord)
    runs = [copy.get(r, RunRecord) for r in job.runs]
    # a prediction record belongs to one run: its path names that run
    bad = runs[0].predictions[0]
    data = copy.backend.get(bad)
    _tamper(copy, bad, data[:-1] + bytes([data[-1] ^ 1]))  # in its value, not its kind
    gone = runs[1].predictions[0]
    copy.backend.delete_many([gone])
    report = verify_result(copy, rid)
    assert not report.ok and report.objects > 0
    by_kind = {p.kind: p for p in report.problems}
    assert set(by_kind) == {"corrupt", "missing"} and len(report.problems) == 2
    corrupt, missing = by_kind["corrupt"], by_kind["missing"]
    assert (corrupt.id, missing.id) == (bad.hex(), gone.hex())
    for p, k in ((corrupt, 0), (missing, 1)):
        run = runs[k]
        patient = copy.get(run.atom).patient
        assert p.message.startswith(
            f"result {rid.hex()[:12]} > jobs[0]: job {job.name} > runs[{k}]: run "
            f"{job.runs[k].hex()[:12]} ({run.pair}, patient {patient}, attempt 1) > "
            "predictions[0]: "
        ), p.message
        assert p.linked_from == [job.runs[k].hex()] and "also linked" not in p.message
    assert corrupt.path[-1] == f"predictions[0]: prediction record {bad.hex()[:12]}"
    assert corrupt.got and corrupt.got != bad.hex() and "is corrupt" in corrupt.message
    assert missing.path[-1] == f"predictions[0]: object {gone.hex()[:12]}"
    assert missing.message.endswith("is missing")

    # an answer blob that several runs wrote alike: named once, its other runs counted
    answers: dict[bytes, int] = {}
    for r in runs:
        assert r.answer is not None
        answers[r.answer] = answers.get(r.answer, 0) + 1
    answer, n = max(answers.items(), key=lambda kv: kv[1])
    data = copy.backend.get(answer)
    _tamper(copy, answer, data[:-1] + bytes([data[-1] ^ 1]))
    [p] = [p for p in verify_result(copy, rid).problems if p.id == answer.hex()]
    assert p.path[-1] == f"answer: blob {answer.hex()[:12]}" and len(p.linked_from) == n
    if n > 1:
        assert f"also linked from {n - 1} other run" in p.message

    # the instruction: one blob for the 20 atoms of a pair and arm
    instruction = copy.get(runs[0].atom).instruction
    _tamper(copy, instruction, b"\x00" + copy.backend.get(instruction)[1:])
    [p] = [p for p in verify_result(copy, rid).problems if p.id == instruction.hex()]
    assert len(p.linked_from) == 20 and "also linked from 19 other atom tasks" in p.message
    assert p.path[-1].startswith("instruction: object ")  # its kind is unreadable now


def test_fast_links_are_exact(store: mc.Store, flow: Flow) -> None:
    ids = store.closure([ObjectId.from_hex(x) for x in (flow.a, flow.b, flow.c, flow.d)])
    for oid, data in store.get_raw_many(sorted(ids)):
        assert list(dict.fromkeys(fast_links(data))) == encoding.links(data), oid.hex()
    target = store.get(flow.a, Result).task_set
    # a writer newer than this reader's class: a link in a field the class does not know
    newer = encoding.encode_object(
        PredictionRecord.__kind__,
        1,
        {
            "atom": target,
            "intelligence": "agent",
            "run_id": "r",
            "target": "t",
            "value": 1.0,
            "zz_new_link": ObjectId(bytes(range(32))),
        },
    )
    assert len(fast_links(newer)) == 2
    # a link mark inside a value that is not a link costs a full decode, never a false link
    fake = encoding.encode_object(
        PredictionRecord.__kind__,
        1,
        {
            "atom": target,
            "intelligence": "agent",
            "run_id": "r",
            "target": "t",
            "value": "x",
            "scores": {"a": 1.0},
            "blob": LINK_MARK + bytes(32),
        },
    )
    assert fake.count(LINK_MARK) == 2 and fast_links(fake) == [target]
    with pytest.raises(mc.InvalidObject):
        fast_links(encoding.encode_object("test-audit", 1, [ObjectId(bytes(32))])[:-3])


# -- diff -------------------------------------------------------------------------------------
def test_diff_of_a_result_with_itself_is_empty(store: mc.Store, flow: Flow) -> None:
    assert diff_results(store, flow.a, flow.a) == []
    assert diff_text([]) == ["no differences"]


def test_diff_names_cohort_version_and_template_change(store: mc.Store, flow: Flow) -> None:
    diffs = diff_results(store, flow.a, flow.b)
    [version] = _find(diffs, category="build-config", field="cohort version")
    assert (version.pair, version.arms, version.old, version.new) == (
        CKD,
        ["no-perception"],
        "1.0",
        "1.1",
    )
    [statement] = _find(diffs, category="build-config", field="template.agent.statement")
    assert statement.old.strip() == OLD_STATEMENT and statement.new.strip() == NEW_STATEMENT
    assert statement.pair == CKD
    [line] = _find(diffs, category="instruction")
    assert line.field == "instruction line 1" and line.pair == CKD
    assert (line.old, line.new) == (OLD_STATEMENT, NEW_STATEMENT)
    # nothing else in the build changed: the other pair, the data, the answers are the same
    assert not [d for d in diffs if d.pair == HBA1C]
    assert not _find(diffs, category="evidence") and not _find(diffs, category="answers")
    assert {d.category for d in diffs} == {"build-config", "instruction", "runs"}
    [runs] = _find(diffs, category="runs", field="runs")
    assert runs.job == "baseline no-perception r1" and "20 on atom tasks that changed" in runs.note
    text = diff_text(diffs)
    assert f"{CKD} no-perception: cohort version 1.0 -> 1.1" in text
    assert any(t.startswith(f"{CKD} no-perception: template.agent.statement ") for t in text)


def test_diff_names_the_patient_and_file_whose_evidence_differs(
    store: mc.Store, flow: Flow
) -> None:
    diffs = diff_results(store, flow.b, flow.c)
    evidence = _find(diffs, category="evidence")
    assert evidence and {d.patient for d in evidence} == {flow.patient}
    assert {d.field for d in evidence} == {"evidence labs.jsonl"}
    assert all(d.change == "changed" and d.old and d.new for d in evidence)
    assert not _find(diffs, category="build-config")  # the config hash covers no data
    assert not _find(diffs, category="answers")  # potassium is no target
    assert not _find(diffs, category="patients")
    assert f"{CKD} patient {flow.patient}: evidence labs.jsonl" in "\n".join(diff_text(diffs))
    # A to C: both the config and the evidence
    both = {d.category for d in diff_results(store, flow.a, flow.c)}
    assert {"build-config", "instruction", "evidence"} <= both


def test_diff_names_agent_and_runner(store: mc.Store, flow: Flow) -> None:
    diffs = diff_results(store, flow.c, flow.d)
    fields = {d.field: (d.old, d.new) for d in _find(diffs, category="agent-config")}
    assert fields["name"] == ("baseline", "replay-baseline")
    assert fields["scaffold"] == ("process", "replay")
    assert "options.source" in fields and "options.command" in fields
    [runner] = _find(diffs, category="runner")
    assert (runner.old, runner.new) == ("process", "replay")
    assert runner.agent == "baseline" and not runner.job  # named once per agent
    assert all(d.agent == "baseline" for d in _find(diffs, category="agent-config"))
    [runs] = _find(diffs, category="runs", field="runs")
    assert runs.job == "baseline no-perception r1" and "40 run again" in runs.note
    text = diff_text(diffs)
    assert "agent baseline: scaffold process -> replay" in text
    assert text.index("agent baseline: runner process -> replay") < text.index(
        "job baseline no-perception r1: runs 40 -> 40 " + f"({runs.note})"
    )
    assert not _find(diffs, category="build-config") and not _find(diffs, category="evidence")


def test_diff_limit_counts_the_rest(store: mc.Store, flow: Flow) -> None:
    full = diff_results(store, flow.b, flow.c, limit=None)
    none = diff_results(store, flow.b, flow.c, limit=0)
    assert not [d for d in none if d.patient]
    assert _find(none, category="evidence", field="evidence")[0].note.startswith("and 1 more")
    assert len([d for d in full if d.patient]) >= 1


# -- PROV-JSON --------------------------------------------------------------------------------
RELATIONS = {
    "wasGeneratedBy": ("prov:entity", "prov:activity"),
    "used": ("prov:activity", "prov:entity"),
    "wasDerivedFrom": ("prov:generatedEntity", "prov:usedEntity"),
    "wasAssociatedWith": ("prov:activity", "prov:agent"),
    "wasAttributedTo": ("prov:entity", "prov:agent"),
}


def _check_prov(doc: dict[str, Any]) -> None:
    for key in ("prefix", "entity", "activity", "agent", *RELATIONS):
        assert key in doc, key
    assert json.loads(json.dumps(doc)) == doc
    declared = {
        "entity": set(doc["entity"]),
        "activity": set(doc["activity"]),
        "agent": set(doc["agent"]),
    }
    assert not (declared["entity"] & declared["activity"])
    prefixes = set(doc["prefix"])
    for section in ("entity", "activity", "agent"):
        for ident in doc[section]:
            assert ident.split(":", 1)[0] in prefixes, ident
    for rel, ends in RELATIONS.items():
        for ident, body in doc[rel].items():
            assert ident.startswith("_:")
            for end in ends:
                kind = (
                    end.split(":")[1]
                    .replace("generatedEntity", "entity")
                    .replace("usedEntity", "entity")
                )
                assert body[end] in declared[kind], (rel, end, body[end])
    generated = [b["prov:entity"] for b in doc["wasGeneratedBy"].values()]
    assert len(generated) == len(set(generated))  # one generation per entity


def _types(doc: dict[str, Any], section: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for body in doc[section].values():
        t = body.get("prov:type", {}).get("$", "")
        out[t] = out.get(t, 0) + 1
    return out


def test_prov_json(store: mc.Store, flow: Flow) -> None:
    doc = to_prov_json(store, flow.a)
    _check_prov(doc)
    types = _types(doc, "entity")
    assert types["medomni:result"] == 1 and types["medomni:task-set"] == 1
    assert types["medomni:build-config"] == 2 and types["medomni:answer-key"] == 2
    assert types["medomni:atom-task"] == 40 and types["medomni:run"] == 40
    assert types["medomni:prediction-table"] == 1 and types["medomni:dataset-release"] == 1
    assert _types(doc, "activity") == {"medomni:scoring": 1, "medomni:build": 2, "medomni:job": 1}
    agents = {b["prov:label"]: b for b in doc["agent"].values()}
    assert agents["baseline"]["medomni:model"] == "none"
    assert agents["baseline"]["prov:type"]["$"] == "prov:SoftwareAgent"
    assert agents["medomni-v1 1.0.0"]["medomni:version"] == "1.0.0"
    assert f"medomni:{flow.a}" in doc["entity"]
    # over the limit: atoms and runs are summarised by their build and job
    small = to_prov_json(store, flow.a, max_items=10)
    _check_prov(small)
    assert "medomni:run" not in _types(small, "entity")
    assert "medomni:atom-task" not in _types(small, "entity")
    assert sum(1 for b in small["used"].values() if b["prov:activity"].startswith("medomni:job-"))


# -- CLI --------------------------------------------------------------------------------------
def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_show_diff_export(
    capsys: pytest.CaptureFixture[str], flow: Flow, tmp_path: Path
) -> None:
    s = ("--store", flow.url)
    code, out, _ = _run(capsys, "audit", "show", flow.a, *s)
    assert code == 0 and "cohort n20" in out and "agent baseline" in out
    code, out, _ = _run(capsys, "audit", "show", "results/" + SET, "--runs", "--json", *s)
    data = json.loads(out)
    assert code == 0 and data["result"] == flow.c and len(data["jobs"][0]["run_list"]) == 40

    code, out, _ = _run(capsys, "audit", "diff", flow.a, flow.a, *s)
    assert code == 0 and out.splitlines()[-1] == "no differences"
    # results that differ exit 1, as `git diff --exit-code`
    code, out, _ = _run(capsys, "audit", "diff", flow.a[:12], flow.b, "--json", *s)
    data = json.loads(out)
    assert code == 1 and data["a"] == flow.a and data["b"] == flow.b
    assert {
        "category": "build-config",
        "field": "cohort version",
        "old": "1.0",
        "new": "1.1",
        "pair": CKD,
        "arms": ["no-perception"],
    } in data["differences"]

    code, out, _ = _run(capsys, "audit", "export", flow.a, *s)
    assert code == 0
    _check_prov(json.loads(out))
    target = tmp_path / "prov.json"
    code, out, _ = _run(capsys, "audit", "export", flow.a, "-o", str(target), "--json", *s)
    assert code == 0 and json.loads(out)["path"] == str(target)
    _check_prov(json.loads(target.read_text()))


# LMDB refuses to open one environment twice in a process: the CLI tests open the shared
# store only through the CLI (no `store` fixture), and read what they need beforehand.
def test_cli_verify_exit_codes(
    capsys: pytest.CaptureFixture[str], flow: Flow, tmp_path: Path
) -> None:
    code, out, _ = _run(capsys, "audit", "verify", flow.a, "--store", flow.url)
    assert code == 0 and out.startswith(f"result {flow.a}: ok") and "objects/s" in out

    url = f"lmdb://{tmp_path}/copy"
    with mc.open(flow.url, create=False) as store, mc.open(url) as copy:
        rid = _copy_closure(store, flow.a, copy)
        sb = copy.get(copy.get(rid, Result).set_build, SetBuild)
        content = copy.get(copy.get(sb.entries[0].result, BuildResult).content, Content)
        patient = content.patients[3]
        tree = copy.get(content.evidence[patient])
        victim = tree["labs.jsonl"]
        _tamper(copy, victim, _flip(copy.backend.get(victim), random.Random(2)))
    code, out, err = _run(capsys, "audit", "verify", rid.hex(), "--store", url)
    assert code == 1, err
    assert f"corrupt: result {rid.hex()[:12]}" in out and victim.hex()[:12] in out
    assert f"evidence['{patient}']" in out and "labs.jsonl: blob" in out
    code, out, _ = _run(capsys, "audit", "verify", rid.hex(), "--store", url, "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["problems"][0]["id"] == victim.hex()


def test_cli_unknown_or_wrong_result(capsys: pytest.CaptureFixture[str], flow: Flow) -> None:
    with mc.open(flow.url, create=False) as store:
        ts = store.get(flow.a, Result).task_set.hex()
    for verb in ("show", "verify", "export"):
        code, out, err = _run(capsys, "audit", verb, "results/nope", "--store", flow.url)
        assert code == 2 and "Traceback" not in err and "results/nope" in err, verb
    code, _, err = _run(capsys, "audit", "diff", flow.a, "deadbeefdeadbeef", "--store", flow.url)
    assert code == 2 and "deadbeefdeadbeef" in err
    code, out, err = _run(capsys, "audit", "show", ts, "--store", flow.url, "--json")
    assert code == 2 and "not a result" in err and json.loads(out)["error"]["type"] == "AuditError"
    code, _, err = _run(capsys, "audit", "verify", ts, "--store", flow.url)
    assert code == 2 and "not a result" in err


def test_cli_takes_the_set_name(capsys: pytest.CaptureFixture[str], flow: Flow) -> None:
    # `medomni-bench/small` is the set's latest score, as in the notebook (results/<set>)
    s = ("--store", flow.url)
    for verb in ("show", "verify", "export"):
        code, out, err = _run(capsys, "audit", verb, SET, "--json", *s)
        assert code == 0, (verb, err)
        data = json.loads(out)
        if verb != "export":
            assert data["result"] == flow.c, verb
    code, out, _ = _run(capsys, "audit", "show", SET, *s)
    assert code == 0 and out.startswith(f"result {flow.c}")
    code, out, _ = _run(capsys, "audit", "diff", flow.a, SET, "--json", *s)
    assert code == 1 and json.loads(out)["b"] == flow.c
    code, _, err = _run(capsys, "audit", "show", "medomni-bench/none", *s)
    assert code == 2 and "medomni-bench/none" in err
