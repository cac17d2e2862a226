"""The refs Bench writes: every name under its namespace is made here.

Namespace
---------
Each prefix, what its refs point at, and who moves them::

    runs/slots/<slot hex>           the run slot's latest `RunRecord`      (stores written before
                                    (read; no longer written)              chunks)
    runs/chunks/<chunk hex>         the `SlotChunk` of a chunk of a job's   harness.chunkclaims
                                    slots: the latest run of each (newer
                                    than its runs/slots/ ref, if any)
    runs/claims/<chunk hex>         a claim blob naming its holder         harness.claims
                                    "<host> <pid> <start> <nonce> <lease>"
                                    (before leases: "<host> <pid> <time>"),
                                    create-only while the chunk runs
                                    (before chunks: one per slot)
    runs/leases/<nonce>             a harness's heartbeat, a blob "<host>  harness.claims
                                    <pid> <start> <nonce> <lease> <time>"
                                    renewed every lease/3 while it works
    runs/jobs/<job key hex>         the job's `JobRecord`                  recording.record_job
    runs/job-names/<job key hex>    a blob "<started>\\n<run folder name>", harness (first start)
                                    create-only
    bench/agents/<name>             the `AgentConfig` last run under the   harness.run_set
                                    name (what a replay's source names)
    results/<benchmark>/<set>       the set's latest `Result`              scorer.score_jobs
    scores/answers/<set build hex>/<arm label>
                                    the arm's `AnswerColumns`              columns.answer_columns
    comparisons/<benchmark>/<set>   the set's latest `Comparison`          contrasts.compare_jobs
    scores/evidence/<build hex>     a blob: the evidence tree id of each   contrasts (pairing)
                                    atom of the `BuildResult`, 32 bytes
                                    each, in its atoms' order

A job key is ``hash(task set, agent config, arm label, repetition)``, so a job's two refs
share it. Names on disk are forever: a store written before keeps its refs.

Studio's namespace is `medomni_cas.studio.refnames` (Studio never imports Bench).
"""

from __future__ import annotations

from medomni_cas.store.ids import ObjectId, hash_bytes

__all__ = [
    "AGENT_REFS",
    "ANSWER_REFS",
    "CHUNK_REFS",
    "CLAIM_REFS",
    "COMPARISON_REFS",
    "EVIDENCE_REFS",
    "JOB_NAME_REFS",
    "JOB_REFS",
    "LEASE_REFS",
    "RESULT_REFS",
    "SLOT_REFS",
    "agent_ref",
    "answers_ref",
    "chunk_ref",
    "claim_ref",
    "comparison_ref",
    "evidence_ref",
    "job_name_ref",
    "job_ref",
    "lease_ref",
    "result_ref",
    "slot_of_claim",
    "slot_ref",
]

SLOT_REFS = "runs/slots/"
CLAIM_REFS = "runs/claims/"
CHUNK_REFS = "runs/chunks/"
JOB_REFS = "runs/jobs/"
JOB_NAME_REFS = "runs/job-names/"
LEASE_REFS = "runs/leases/"
AGENT_REFS = "bench/agents/"
RESULT_REFS = "results/"
ANSWER_REFS = "scores/answers/"
COMPARISON_REFS = "comparisons/"
EVIDENCE_REFS = "scores/evidence/"


def slot_ref(slot: bytes) -> str:
    """``runs/slots/<slot hex>``: the slot's latest run (`Refs.get_many_by_id` reads a batch)."""
    return f"{SLOT_REFS}{slot.hex()}"


def chunk_ref(chunk: bytes) -> str:
    """``runs/chunks/<chunk hex>``: the table of a chunk's latest runs (`bench.slottables`)."""
    return f"{CHUNK_REFS}{chunk.hex()}"


def claim_ref(slot: bytes) -> str:
    return f"{CLAIM_REFS}{slot.hex()}"


def slot_of_claim(name: str) -> bytes | None:
    """The slot a ``runs/claims/`` ref names, or None for a name no harness made."""
    try:
        return bytes.fromhex(name.removeprefix(CLAIM_REFS))
    except ValueError:
        return None


def lease_ref(nonce: str) -> str:
    """``runs/leases/<nonce>``: the heartbeat of the harness whose claims name ``nonce``."""
    return f"{LEASE_REFS}{nonce}"


def _job_key(task_set: ObjectId, agent: ObjectId, arm_label: str, rep: int) -> str:
    key = hash_bytes(b"medomni.job\0" + task_set + agent + arm_label.encode() + b"\0%d" % rep)
    return key.hex()


def job_ref(task_set: ObjectId, agent: ObjectId, arm_label: str, rep: int) -> str:
    """``runs/jobs/<job key>``: the job's record."""
    return f"{JOB_REFS}{_job_key(task_set, agent, arm_label, rep)}"


def job_name_ref(task_set: ObjectId, agent: ObjectId, arm_label: str, rep: int) -> str:
    """``runs/job-names/<job key>``: the job's start time and run folder name, kept from its
    first start."""
    return f"{JOB_NAME_REFS}{_job_key(task_set, agent, arm_label, rep)}"


def agent_ref(name: str) -> str:
    return f"{AGENT_REFS}{name}"


def result_ref(set_name: str) -> str:
    return f"{RESULT_REFS}{set_name}"


def answers_ref(set_build: ObjectId, arm_label: str) -> str:
    return f"{ANSWER_REFS}{set_build.hex()}/{arm_label}"


def comparison_ref(set_name: str) -> str:
    return COMPARISON_REFS + set_name


def evidence_ref(build: ObjectId) -> str:
    return f"{EVIDENCE_REFS}{build.hex()}"
