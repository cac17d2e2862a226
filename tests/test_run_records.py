"""Run records as the Runs document lists them: every field of runs.jsonl spelled out, each
encoder call's level in encoder_use.jsonl (only on arms with the perception service), the
runner an agent config's scaffold picks, and the intelligence kinds a benchmark card accepts.

Real components: the baseline agent as real subprocesses, a real LMDB store, the CLI in
process through ``main([...])``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.agents import find_agent, load_agent
from medomni_cas.bench.harness import CheckFailed, RunReport, run_set
from medomni_cas.bench.records import AgentBlock, AgentConfig, JobRecord, Limits, RunRecord
from medomni_cas.bench.runfolders import import_run_folder
from medomni_cas.bench.runners import RunnerError, pick_runner, runner_for, runner_names
from medomni_cas.cli import main
from medomni_cas.studio.tasksets import build_set
from tests._sets import N20_PAIRS, small_tree

SET = "medomni-bench/records"
NOP, REQ, CHECKLIST = "no-perception", "encoders-required", "checklist"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One n20 pair under an arm without the service, one requiring it, and a plug-in arm
    without it (the example plug-in's ``checklist``)."""
    root = tmp_path_factory.mktemp("records")
    return small_tree(root, arms=[NOP, REQ, CHECKLIST], pairs=N20_PAIRS[:1], name="records")


@pytest.fixture(scope="module")
def ran(tree: Path) -> Iterator[tuple[mc.Store, list[RunReport]]]:
    """The set built and run by the baseline: the whole of no-perception, a shard of the rest."""
    store = mc.open(f"lmdb://{tree / 'store'}")
    build_set(store, SET, studio=tree / "studio", bench=tree / "bench")
    agent = find_agent(tree / "bench", "baseline")
    kw: dict[str, Any] = {"runs_dir": tree / "runs", "studio": tree / "studio"}
    reports = [
        run_set(store, SET, agent, arms=[NOP], bench=tree / "bench", **kw),
        run_set(store, SET, agent, arms=[REQ, CHECKLIST], shard=(0, 4), **kw),
    ]
    yield store, reports
    store.close()


def _folders(ran: tuple[mc.Store, list[RunReport]]) -> dict[str, Path]:
    """Each job's run folder by its arm."""
    store, reports = ran
    return {store.get(j.job, JobRecord).arm: j.folder for r in reports for j in r.jobs}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


# -- runs.jsonl ---------------------------------------------------------------------------------
def test_runs_jsonl_spells_every_field_even_when_empty(
    ran: tuple[mc.Store, list[RunReport]],
) -> None:
    folders = _folders(ran)
    assert set(folders) == {NOP, REQ, CHECKLIST}
    for arm, folder in folders.items():
        lines = _lines(folder / "runs.jsonl")
        assert lines, arm
        for line in lines:
            record = line["record"]
            assert set(record) == set(RunRecord.__struct_fields__), arm
            assert set(record["agent_block"]) == set(AgentBlock.__struct_fields__), arm
            assert record["errors"] == [] and record["outcome"] == "answered"
            assert "cost_usd" in record and "environment" in record and "isolation" in record
            assert record["agent_block"]["arm_variant"] == ""
            if arm != REQ:
                assert record["agent_block"]["encoder_calls"] == 0
                assert record["agent_block"]["encoder_log"] is None
                assert record["agent_block"]["encoders_served"] == []
            # the line is the record: its fields give back the bytes of its id
            run = ran[0].get(mc.ObjectId.from_hex(line["id"]), RunRecord)
            assert record["run_id"] == run.run_id and record["isolation"] == run.isolation


def test_a_run_folder_imports_as_written_and_as_written_before(
    ran: tuple[mc.Store, list[RunReport]], tmp_path: Path
) -> None:
    store, reports = ran
    for report in reports:
        for j in report.jobs:
            with mc.open(f"lmdb://{tmp_path / j.folder.name / 'store'}") as other:
                assert import_run_folder(other, j.folder) == j.job
                job = other.get(j.job, JobRecord)
                assert [other.get(r, RunRecord) for r in job.runs] == [
                    store.get(r, RunRecord) for r in job.runs
                ]
    # a folder written before: records with their defaults left out, calls without a level
    folder = _folders(ran)[REQ]
    old = tmp_path / "old"
    old.mkdir()
    for p in folder.rglob("*"):
        if p.is_file():
            (old / p.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (old / p.relative_to(folder)).write_bytes(p.read_bytes())
    lines = []
    for line in _lines(old / "runs.jsonl"):
        rec = store.get(mc.ObjectId.from_hex(line["id"]), RunRecord)
        lines.append(json.dumps({"id": line["id"], "record": json.loads(_omitting(rec))}))
    (old / "runs.jsonl").write_text("\n".join(lines) + "\n")
    uses = [  # the call's bytes as logged, the line without its level
        msgspec.json.encode({"call": u.call, "run_id": u.run_id}) + b"\n"
        for u in map(_USE.decode, (old / "encoder_use.jsonl").read_bytes().splitlines())
    ]
    assert uses
    (old / "encoder_use.jsonl").write_bytes(b"".join(uses))
    assert '"errors"' not in (old / "runs.jsonl").read_text()
    (job,) = [j.job for r in reports for j in r.jobs if j.folder == folder]
    with mc.open(f"lmdb://{tmp_path / 'old-store'}") as other:
        assert import_run_folder(other, old) == job
        assert other.get(job, JobRecord).runs == store.get(job, JobRecord).runs


class _Use(msgspec.Struct):
    run_id: str
    call: msgspec.Raw


_USE = msgspec.json.Decoder(_Use)


def _omitting(rec: RunRecord) -> bytes:
    """The record as JSON the way run folders wrote it before: defaults left out."""

    def hook(obj: object) -> object:
        if isinstance(obj, mc.ObjectId):
            return obj.hex()
        raise NotImplementedError(type(obj).__name__)

    return msgspec.json.encode(rec, enc_hook=hook)


# -- encoder_use.jsonl --------------------------------------------------------------------------
def test_encoder_use_has_each_calls_level_and_only_on_arms_with_the_service(
    ran: tuple[mc.Store, list[RunReport]],
) -> None:
    store, _ = ran
    folders = _folders(ran)
    uses = _lines(folders[REQ] / "encoder_use.jsonl")
    runs = {x["record"]["run_id"]: x["record"] for x in _lines(folders[REQ] / "runs.jsonl")}
    assert uses and {u["run_id"] for u in uses} == set(runs)
    for u in uses:
        assert u["level"] == u["call"]["level"] == "measurements", u
    for r in runs.values():
        log = store.read_blob(mc.ObjectId.from_hex(r["agent_block"]["encoder_log"]))
        assert all(json.loads(c)["level"] == "measurements" for c in log.splitlines())
    # no perception service, no file: the built-in arm and a plug-in's
    assert not (folders[NOP] / "encoder_use.jsonl").exists()
    assert not (folders[CHECKLIST] / "encoder_use.jsonl").exists()


# -- the scaffold picks the runner --------------------------------------------------------------
def _agent(scaffold: str, name: str = "a", **options: object) -> AgentConfig:
    return AgentConfig(
        name=name,
        kind="agent",
        agent=name,
        model="none",
        route="local",
        scaffold=scaffold,
        served_model="none",
        limits=Limits(),
        options=dict(options),
    )


def test_the_scaffold_picks_the_runner() -> None:
    cmd = ["python", "-m", "medomni_cas.bench.baseline"]
    assert runner_for(_agent("process", command=cmd)) == "process"
    assert runner_for(_agent("baseline", command=cmd)) == "process"
    assert runner_for(_agent("replay", source="baseline")) == "replay"
    if "harbor" in runner_names():  # the adapter, when installed
        assert runner_for(_agent("terminus-2")) == "harbor"
        assert runner_for(_agent("probe", harbor_agent="tests.test_harbor:ProbeAgent")) == "harbor"
        # Harbor also drives commands and replays when named
        assert pick_runner(_agent("process", command=cmd), "harbor").name == "harbor"
        assert pick_runner(_agent("replay", source="b"), "harbor").name == "harbor"
    with pytest.raises(RunnerError, match=r"agent config odd: scaffold 'no-such-scaffold' is"):
        runner_for(_agent("no-such-scaffold", name="odd"))
    with pytest.raises(RunnerError, match=r"runner 'process' cannot drive scaffold 'replay'"):
        pick_runner(_agent("replay", source="baseline"), "process")
    with pytest.raises(RunnerError, match=r"runner 'replay' cannot drive scaffold 'process'"):
        pick_runner(_agent("process", command=cmd), "replay")


def test_bench_run_without_runner_runs_the_scaffolds_runner(
    ran: tuple[mc.Store, list[RunReport]], tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = ran
    base = [
        *("bench", "run", SET, "--store", f"lmdb://{tree / 'store'}"),
        *("--studio", str(tree / "studio"), "--bench", str(tree / "bench")),
        *("--runs", str(tree / "runs"), "--arm", NOP),
    ]
    odd = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    odd["settings"]["scaffold"] = "no-such-scaffold"
    (tree / "bench/agents/odd.yaml").write_text(yaml.safe_dump(odd))
    assert main([*base, "--agent", "odd"]) == 2
    err = capsys.readouterr().err
    assert "agent config odd" in err and "'no-such-scaffold'" in err, err
    assert main([*base, "--agent", "replay-baseline", "--runner", "process"]) == 2
    assert "runner 'process' cannot drive scaffold 'replay'" in capsys.readouterr().err
    # no --runner: the replay config runs on the replay runner
    assert main([*base, "--agent", "replay-baseline"]) == 0, capsys.readouterr().err
    replay = store.refs.get("bench/agents/replay-baseline")
    runs = [
        store.get(o, RunRecord)
        for o in store.iter_ids()
        if store.kind(o) == "medomni.run" and store.get(o, RunRecord).agent_config == replay
    ]
    assert runs and {r.runner for r in runs} == {"replay"}
    assert {r.outcome for r in runs} == {"answered"}


# -- benchmark cards ------------------------------------------------------------------------------
def test_a_card_refuses_an_intelligence_kind_it_does_not_accept(
    ran: tuple[mc.Store, list[RunReport]], tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = ran
    card = tree / "bench/benchmarks/medomni-bench/benchmark.yaml"
    text = card.read_text()
    agent = load_agent(tree / "bench/agents/baseline.yaml")
    kw: dict[str, Any] = {"runs_dir": tree / "runs", "studio": tree / "studio", "arms": [NOP]}
    try:
        card.write_text(
            text.replace("intelligence_kinds: [agent]", "intelligence_kinds: [human-reader]")
        )
        with pytest.raises(CheckFailed) as e:
            run_set(store, SET, agent, bench=tree / "bench", **kw)
        (problem,) = e.value.problems
        assert str(card) in problem and "intelligence_kinds" in problem, problem
        assert "human-reader" in problem and "'agent'" in problem
        code = main(
            [
                *("bench", "run", SET, "--agent", "baseline", "--arm", NOP),
                *("--store", f"lmdb://{tree / 'store'}", "--runs", str(tree / "runs")),
                *("--studio", str(tree / "studio"), "--bench", str(tree / "bench")),
            ]
        )
        assert code == 1 and str(card) in capsys.readouterr().err
    finally:
        card.write_text(text)
    # a card found nowhere is not checked, and the run says so
    report = run_set(store, SET, agent, bench=None, **kw)
    assert any("not checked" in n for n in report.notices), report.notices
