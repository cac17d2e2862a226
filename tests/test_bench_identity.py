"""Golden vectors for Bench's record kinds: the same record must keep the same id forever.

If one of these fails, a change altered the canonical bytes of a released kind: undo it, or
give the new encoding a new kind version. Never regenerate these values.
"""

from __future__ import annotations

import msgspec
import pytest

from medomni_cas.bench import records as r
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes

L = ObjectId(bytes(range(32)))
M = ObjectId(bytes(range(32, 64)))
SAMPLES = {
    "agent-config": r.AgentConfig(
        name="baseline",
        kind="agent",
        agent="baseline",
        model="none",
        route="local",
        scaffold="process",
        served_model="none",
        limits=r.Limits(time_sec=120),
        options={"command": ["python", "-m", "x"]},
    ),
    "run-slot": r.RunSlot(atom=L, agent_config=M, arm_variant="modality-ladder.r2", repetition=1),
    "run": r.RunRecord(
        run_id="ab-1",
        slot="ab",
        attempt=1,
        intelligence="agent",
        agent_config=L,
        task_set=M,
        atom=L,
        pair="t@n20",
        task_version="1.0",
        config=M,
        repetition=1,
        runner="process",
        outcome="answered",
        served_model="none",
        cost_usd=0.5,
        tokens_in=10,
        errors=("e",),
        started="2026-11-30T00:00:00.000+00:00",
        finished="2026-11-30T00:00:01.000+00:00",
        elapsed_ms=1000,
        agent_block=r.AgentBlock(
            arm="encoders",
            encoders="allowed",
            encoders_served=(r.EncoderServed(name="ecg-summary", version="1.0.0", digest="ff"),),
            encoder_calls=1,
            encoder_log=L,
            files_opened=("labs.jsonl",),
        ),
        answer=M,
        logs=L,
        predictions=(M,),
    ),
    "prediction": r.PredictionRecord(
        run_id="ab-1",
        atom=L,
        target="ckd_stage",
        value="G2",
        intelligence="agent",
        scores={"G1": 0.25, "G2": 0.75},
    ),
    "prediction-table": r.PredictionTable(rows=2, columns=("run_id", "target"), table=L),
    "prediction-columns": r.PredictionColumns(rows=40, columns={"atom": L, "value_text": M}),
    "answer-columns": r.AnswerColumns(
        set_build=L,
        arm="modality-ladder",
        arm_variant="r2",
        answer_keys=(M,),
        rows=40,
        groups=(
            r.AnswerGroup(
                pair="t@n20",
                target="ckd_stage",
                metric="macro_f1",
                config=M,
                numeric=False,
                start=0,
                stop=20,
            ),
            r.AnswerGroup(
                pair="t@n20", target="egfr", metric="mae", config=M, numeric=True, start=20, stop=40
            ),
        ),
        columns={"atom": L, "target": M, "pair": M, "truth_text": L},
    ),
    "job": r.JobRecord(
        name="b.v1--a--encoders--r1--x",
        task_set=L,
        set_build=M,
        agent_config=L,
        arm="encoders",
        repetition=1,
        runner="process",
        runs=(L, M),
        attempts=3,
        predictions=M,
        started="2026-11-30T00:00:00.000+00:00",
    ),
    "result": r.Result(
        task_set=L,
        set_build=M,
        jobs=(L,),
        answer_keys=(M,),
        scorer="medomni-scorer",
        scorer_version="1.0.0",
        n_boot=1000,
        seed=0,
        rows=(
            r.ScoreRow(
                agent="a",
                arm="encoders",
                pair="t@n20",
                target="y",
                metric="accuracy",
                value=0.5,
                ci_low=0.25,
                ci_high=0.75,
                n=20,
                config="cc",
            ),
        ),
        table=L,
    ),
}

GOLDEN = {
    "agent-config": "1cfd8de0f03ca72b7f0c42ffbf35ff8f0fb40e9ff95d76cd0b04f8e5162de2b9",
    "run-slot": "d146976600a640d00eb25810860993a2db81bc9b96168e1a44ad92a467bd2a90",
    "run": "359b82eaf407d7b3bcc986270d590cc8bc20ada8c3de94de36240290b56341fa",
    "prediction": "105bc96906fcb8bc822c8d556011aaca6ccdd2e4667334f39909896a10ae78a4",
    "prediction-table": "9dbd166972cfef2959f45ac424c59f700bb64f3d0eeec9d7f1d80fdeece14fa3",
    "prediction-columns": "06b5a241a6a8f42630f08dd7ee48b0fbcb154c98fda76586c5132e77b19dd69a",
    "answer-columns": "a38d0332f55a7965f6bdb78d4844e5f732d3cc969204ee5e2df81061b0f52b08",
    "job": "e04303793d35761f0f587b21753db8bf6f68a1ff246c91ebf74a424e0ab81f22",
    "result": "0b253869eefc5ad74c2f27dc13082cc575652b6e84ebcb07d94c0e3bb28b3d98",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_bench_record_ids_never_change(name: str) -> None:
    data = encoding.encode(SAMPLES[name])
    assert hash_bytes(data).hex() == GOLDEN[name]
    assert encoding.kind_of(data)[0] == f"medomni.{name}"


def test_a_result_with_answer_columns_keeps_its_id() -> None:
    # the field came after results were first written: without it, the bytes are the old ones
    result = msgspec.structs.replace(SAMPLES["result"], answer_columns=(L,))
    assert hash_bytes(encoding.encode(result)).hex() == (
        "c789f79a1f98e22a12ee7fba1f017766273631414500f1d3abcd9790d2774c27"
    )


def test_every_bench_kind_has_a_vector() -> None:
    kinds = {
        cls.__kind__
        for cls in vars(r).values()
        if isinstance(cls, type) and issubclass(cls, encoding.Record) and cls is not encoding.Record
    }
    assert kinds == {f"medomni.{k}" for k in GOLDEN}


def test_slot_id_is_the_id_of_its_run_slot() -> None:
    slot = r.slot_id(L, M, "modality-ladder.r2", 1)
    assert slot.hex() == GOLDEN["run-slot"]
