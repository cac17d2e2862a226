"""Golden vectors for Studio's record kinds: the same record must keep the same id forever.

If one of these fails, a change altered the canonical bytes of a released kind: undo it, or
give the new encoding a new kind version. Never regenerate these values.
"""

from __future__ import annotations

import pytest

from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.studio import records as r

L = ObjectId(bytes(range(32)))
M = ObjectId(bytes(range(32, 64)))
SAMPLES = {
    "build-config": r.BuildConfig(
        pair="t@n20",
        version="1.0",
        builder="medomni-v1",
        builder_version="1.0.0",
        medomni_release="0.3.0",
        dataset="d",
        dataset_release="2026.1",
        template={"name": "t"},
        targets=({"label": "y", "metric": "accuracy"},),
        cohort={"size": 20},
        labels={"y": {"recipe": "last_before"}},
        arm="encoders",
        arm_definition={"encoders": "allowed"},
    ),
    "content": r.Content(
        dataset="d",
        dataset_release="2026.1",
        pair="t@n20",
        patients=("p1",),
        evidence={"p1": L},
        prediction_times={"p1": "2026-01-01T00:00:00"},
    ),
    "answer-key": r.AnswerKey(content=L, targets=("y",), values={"p1": {"y": "G2"}}),
    "format-check": r.FormatCheck(
        targets=(r.TargetShape(name="y", kind="class", classes=("G1", "G2")),)
    ),
    "atom-task": r.AtomTask(
        pair="t@n20",
        version="1.0",
        patient="p1",
        prediction_time="2026-01-01T00:00:00",
        arm="encoders",
        instruction=L,
        evidence=M,
        families=("labs",),
        environment=r.AtomEnvironment(
            cpus=1, memory_mb=2048, agent_timeout_sec=900, verifier_timeout_sec=60
        ),
        submission_path="/workspace/answer.json",
        format_check=L,
        config=M,
    ),
    "build": r.BuildResult(
        pair="t@n20",
        version="1.0",
        arm="modality-ladder",
        arm_variant="r1",
        config=L,
        content=M,
        answer_key=L,
        atoms=(M,),
    ),
    "template": r.TemplateRecord(
        name="t", dataset="d", template={"name": "t"}, cohorts={"n20": "1.0"}
    ),
    "benchmark": r.BenchmarkCard(
        name="b", version="0.3.0", owner="o", license="Apache-2.0", intelligence_kinds=("agent",)
    ),
    "task-set": r.TaskSetRecord(
        name="b/v1",
        builder="medomni-v1",
        arms=("encoders",),
        pairs=(r.PinnedPair(task="t@n20", n=1),),
    ),
    "task-set-build": r.SetBuild(
        task_set=L,
        entries=(r.SetEntry(pair="t@n20", version="1.0", arm="encoders", config=L, result=M),),
    ),
    "published-set": r.PublishedSet(
        task_set=L,
        benchmark=M,
        entries=(
            r.PublishedEntry(
                pair="t@n20",
                version="1.0",
                arm="encoders",
                config=L,
                result="ab",
                content="cd",
                atoms=("ef",),
            ),
        ),
    ),
}

GOLDEN = {
    "build-config": "8660773cc7fbac5e4f7a78823af7856a3bd484fc71f2e35a2e69c58b4acbb7df",
    "content": "62855d0263231b7e2bc88d17518c556e52c963b267119d0bdeffac7fef4ae41a",
    "answer-key": "5909bc65ed5900edc6a8bf096686c11b6258123a6e495b9e762ce666b70e3d61",
    "format-check": "3c5363524818593aee3fe831a0c820a979e6a07f105e7ce9aab5b6743aa43211",
    "atom-task": "8a4a748528483c45792bea314ef8b1cbfba59c41ff94b91c1be8b9b64e9a2966",
    "build": "8a6d8183ef9a20c67bef30c723cf312ca67fee1bd7064bb1a315763548299ca3",
    "template": "a608ec7528a3433734d46f1d686769cd2738b3e7e36872c7ab4c06c9e05eb943",
    "benchmark": "974111eed73cb20217aac9dfd40ad0896c70dd28d97a461b94e9b08d9819fc8d",
    "task-set": "f82eb03f2d995ba4f52e0b70a683de2e17f4274f45e02b1ccc27601ed9cd1ca2",
    "task-set-build": "37c3fc3f0c1d4d41d077daec3adfa697789f2265b68ee38553866fb6f1406026",
    "published-set": "4a60dd432971132a9d1e8300c9d09def6504daa8dc41baa3562ba5d77bb5866b",
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_studio_record_ids_never_change(name: str) -> None:
    record = SAMPLES[name]
    assert hash_bytes(encoding.encode(record)).hex() == GOLDEN[name]
    assert encoding.kind_of(encoding.encode(record))[0] == f"medomni.{name}"


def test_every_studio_kind_has_a_vector() -> None:
    kinds = {
        cls.__kind__
        for cls in vars(r).values()
        if isinstance(cls, type) and issubclass(cls, encoding.Record) and cls is not encoding.Record
    }
    assert kinds == {f"medomni.{k}" for k in GOLDEN}
