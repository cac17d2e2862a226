"""The store records Bench writes: agent configs, runs, predictions, jobs and results.

Kind names start with ``medomni.`` and are forever once released (golden vectors in
``tests/test_bench_identity.py``). A run is an event, so its record holds times; everything a
score depends on is linked, so an audit walks from a `Result` down to the atoms, the agent
config, every run and the answer keys.

Predictions exist twice, on purpose: one `PredictionRecord` per target per run (the spec's
record, small and linked from its run), and per job a table of columns
(`PredictionColumns`, one blob per column, rows lined up with the arm's `AnswerColumns`), so
that the scorer reads millions of predictions as one column instead of as millions of
objects. `PredictionTable` (one Arrow blob per job) is the layout jobs had before; it is
still read.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache, partial
from typing import Any, Literal, get_args

import blake3

from medomni_cas.store import encoding
from medomni_cas.store.encoding import Part, Record
from medomni_cas.store.ids import ObjectId, hash_bytes, id_from_digest

__all__ = [
    "AGENT_OUTCOMES",
    "ENCODERS_UNMET",
    "OUTCOMES",
    "AgentBlock",
    "AgentConfig",
    "AnswerColumns",
    "AnswerGroup",
    "EncoderServed",
    "JobRecord",
    "Limits",
    "Outcome",
    "PredictionColumns",
    "PredictionRecord",
    "PredictionTable",
    "Result",
    "RunRecord",
    "RunSlot",
    "ScoreRow",
    "slot_digests",
    "slot_id",
    "slot_ids",
]

#: How a run ended. All but the last are the agent's own outcome: the slot is done. An
#: ``over-limit`` run went past its agent config's token, cost or time limit (whatever it
#: answered is not scored). An ``infra-error`` (the environment never started, the model
#: endpoint failed, the engine died) is kept, and its slot is run again on resume, up to the
#: user's limit. Stored as the plain string.
Outcome = Literal["answered", "malformed", "agent-failed", "timeout", "over-limit", "infra-error"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
AGENT_OUTCOMES: tuple[Outcome, ...] = OUTCOMES[:-1]
#: What a slot counts as in a score when its final run gave no scored answer: its outcome,
#: or this when it answered on an arm that requires the perception service without calling it.
ENCODERS_UNMET = "encoders-unmet"


class Limits(Part, frozen=True, kw_only=True):
    time_sec: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None


class AgentConfig(Record, frozen=True, kw_only=True):
    """``bench/agents/<name>.yaml`` as stored; its id is the agent config id of run slots."""

    __kind__ = "medomni.agent-config"

    name: str
    kind: str  # the intelligence kind: "agent" in v0.3.0
    agent: str
    model: str
    route: str  # "local" | "cloud"
    scaffold: str  # what drives the model: a runner's agent (baseline, replay, terminus-2...)
    served_model: str  # what the provider must report back; a mismatch is a run error
    limits: Limits
    options: dict[str, Any] = {}  # the scaffold's own settings (a command, a replay source)


class RunSlot(Record, frozen=True, kw_only=True):
    """What a run slot is: its id is the hash of these four. Never stored, only hashed."""

    __kind__ = "medomni.run-slot"

    atom: ObjectId
    agent_config: ObjectId
    #: The arm *label*, ``"<arm>"`` or ``"<arm>.<variant>"`` (`studio.arms.arm_label`), not
    #: the variant alone as every other ``arm_variant`` field holds. The name is in the
    #: hashed bytes, so it stays; functions taking it call it ``arm_label``.
    arm_variant: str
    repetition: int


def _slot_id(atom: ObjectId, agent_config: ObjectId, arm_label: str, repetition: int) -> ObjectId:
    """The definition: the hash of the `RunSlot`'s canonical bytes."""
    return hash_bytes(
        encoding.encode(
            RunSlot(
                atom=atom, agent_config=agent_config, arm_variant=arm_label, repetition=repetition
            )
        )
    )


_wrap_id = partial(bytes.__new__, ObjectId)  # an id from a fresh digest, unchecked


@lru_cache(maxsize=64)
def _slot_frame(agent_config: ObjectId, arm_variant: str, repetition: int) -> tuple[bytes, bytes]:
    """The canonical bytes of a `RunSlot` before and after its atom's 32 bytes, which are the
    payload of a fixed-length link, so nothing else in the bytes depends on the atom."""
    # any id stands for the atom: the frame is the same for all
    slot = RunSlot(
        atom=agent_config, agent_config=agent_config, arm_variant=arm_variant, repetition=repetition
    )
    return encoding.link_frame(slot, "atom")


def _plain(agent_config: object, arm_label: object, repetition: object) -> bool:
    # exact types: a bytes agent config or a bool repetition encodes differently
    return type(agent_config) is ObjectId and type(arm_label) is str and type(repetition) is int


def slot_id(atom: ObjectId, agent_config: ObjectId, arm_label: str, repetition: int) -> ObjectId:
    """A run slot's id: ``hash(RunSlot(atom, agent_config, arm_label, repetition))``.

    Hashed from the slot's bytes around the atom, made once per (agent config, arm
    label, repetition): the same bytes as encoding the record, in half the time (`slot_ids`
    for a job's slots: a third).
    """
    if type(atom) is ObjectId and _plain(agent_config, arm_label, repetition):
        head, tail = _slot_frame(agent_config, arm_label, repetition)
        return id_from_digest(blake3.blake3(head + atom + tail).digest())
    return _slot_id(atom, agent_config, arm_label, repetition)


def slot_digests(
    atoms: Iterable[ObjectId], agent_config: ObjectId, arm_label: str, repetition: int
) -> list[bytes]:
    """`slot_ids` as plain 32-byte digests: the resume check of a job's slots needs no
    `ObjectId` for slots that are done, and skips making one for each."""
    atoms = list(atoms)
    if not _plain(agent_config, arm_label, repetition) or set(map(type, atoms)) - {ObjectId}:
        return [bytes(slot_id(a, agent_config, arm_label, repetition)) for a in atoms]
    head, tail = _slot_frame(agent_config, arm_label, repetition)
    # one hasher, reset after each slot: a new one per slot costs a quarter of the time
    hasher = blake3.blake3()
    update, digest, reset = hasher.update, hasher.digest, hasher.reset
    digests: list[bytes] = []
    keep = digests.append
    for a in atoms:
        update(head + a + tail)
        keep(digest())
        reset()
    return digests


def slot_ids(
    atoms: Iterable[ObjectId], agent_config: ObjectId, arm_label: str, repetition: int
) -> list[ObjectId]:
    """`slot_id` of each atom for one agent config, arm label and repetition (a job)."""
    return list(map(_wrap_id, slot_digests(atoms, agent_config, arm_label, repetition)))


class EncoderServed(Part, frozen=True, kw_only=True):
    name: str
    version: str
    digest: str  # the encoder's digest, or its image digest when served from a container


class AgentBlock(Part, frozen=True, kw_only=True):
    """The run's agent block: the arm and what it attached."""

    arm: str
    arm_variant: str = ""
    encoders: str = "none"  # the arm's run side: "allowed" | "none" | "required"
    encoders_served: tuple[EncoderServed, ...] = ()
    encoder_calls: int = 0
    encoder_log: ObjectId | None = None  # blob: the call log, one JSON line per call
    meets_arm: bool = True
    meets_arm_reason: str = ""
    files_opened: tuple[str, ...] = ()


class RunRecord(Record, frozen=True, kw_only=True):
    """One agent on one atom task, once (one attempt of one run slot)."""

    __kind__ = "medomni.run"

    run_id: str  # "<slot hex>-<attempt>"
    slot: str  # hex of the run slot id (a hash, not an object)
    attempt: int  # 1, 2, ... (infra errors are run again)
    previous: ObjectId | None = None  # the attempt before this one
    intelligence: str
    agent_config: ObjectId
    task_set: ObjectId | None = None
    atom: ObjectId
    pair: str
    task_version: str  # N.X
    config: ObjectId  # the build config: the config hash
    repetition: int
    runner: str
    outcome: Outcome
    #: Where the agent ran ("local", or the runner's environment: "docker", "daytona"...) and
    #: what kept it from the store, the answers and other trials: "none" (it ran as you),
    #: "namespaces" (its own user, mount and pid namespaces), "container" (our Docker
    #: environment: no network but the perception service), "harbor-container" (a Harbor
    #: local container, with whatever network it set up), "remote" (a provider's sandbox),
    #: "unknown". Empty in runs recorded before.
    environment: str = ""
    isolation: str = ""
    served_model: str = ""
    cost_usd: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    errors: tuple[str, ...] = ()
    started: str
    finished: str
    elapsed_ms: int
    agent_block: AgentBlock
    answer: ObjectId | None = None  # blob: the file at the submission path, as written
    logs: ObjectId | None = None  # tree of the trial's log files
    predictions: tuple[ObjectId, ...] = ()


class PredictionRecord(Record, frozen=True, kw_only=True):
    """One answer for one target of one atom task: the only thing the scorer reads of a run.

    ``value`` is a number or a class label as text; ``scores`` (class -> probability), when an
    agent gives them, lets the scorer report AUROC.
    """

    __kind__ = "medomni.prediction"

    run_id: str
    atom: ObjectId
    target: str
    value: str | float | None
    intelligence: str
    scores: dict[str, float] = {}


class PredictionTable(Record, frozen=True, kw_only=True):
    """A job's prediction records as one Arrow IPC file (a blob): the layout before
    `PredictionColumns`, still read (the scorer hash-joins it with the answers)."""

    __kind__ = "medomni.prediction-table"

    rows: int
    columns: tuple[str, ...]
    table: ObjectId  # blob: Arrow IPC stream


class PredictionColumns(Record, frozen=True, kw_only=True):
    """A job's predictions, one blob per column (an Arrow IPC stream holding that column).

    Rows follow the key of the job's arm (see `medomni_cas.bench.columns`): one row per atom
    and target, with nulls where no run answered, so the ``atom``, ``target`` and ``pair``
    columns are the very objects of the arm's `AnswerColumns`. A column missing from
    ``columns`` is null in every row.
    """

    __kind__ = "medomni.prediction-columns"

    rows: int
    columns: dict[str, ObjectId]


class AnswerGroup(Part, frozen=True, kw_only=True):
    """Rows ``start:stop`` of an `AnswerColumns`: one pair's one target."""

    pair: str
    target: str
    metric: str
    config: ObjectId  # the pair's build config
    numeric: bool  # scored on ``truth_num``/``value_num``, else on the text columns
    start: int
    stop: int


class AnswerColumns(Record, frozen=True, kw_only=True):
    """The answers of one arm (and rung) of a set build, in the key's row order.

    Derived from the answer keys it links, so the scorer makes it once per arm and finds it
    again by ``scores/answers/<set build>/<arm label>``; every `Result` links the ones it
    scored with. Columns: ``atom``, ``target``, ``pair`` (shared with the jobs' tables),
    ``truth_text``, ``truth_num`` (a missing one is null in every row).
    """

    __kind__ = "medomni.answer-columns"

    set_build: ObjectId
    arm: str
    arm_variant: str = ""
    answer_keys: tuple[ObjectId, ...]
    rows: int
    groups: tuple[AnswerGroup, ...]
    columns: dict[str, ObjectId]


class JobRecord(Record, frozen=True, kw_only=True):
    """One job: a task set's atoms under one arm (and rung), one agent, one repetition."""

    __kind__ = "medomni.job"

    name: str  # the run folder's name
    task_set: ObjectId
    set_build: ObjectId
    agent_config: ObjectId
    arm: str
    arm_variant: str = ""
    repetition: int
    runner: str
    runs: tuple[ObjectId, ...]  # the final run of each slot, in the set's atom order
    attempts: int  # runs recorded, retries included
    predictions: ObjectId  # `PredictionColumns` (or, in jobs written before it, `PredictionTable`)
    started: str


class ScoreRow(Part, frozen=True, kw_only=True):
    agent: str
    arm: str
    arm_variant: str = ""
    pair: str
    target: str
    metric: str
    value: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int
    n_missing: int = 0
    config: str  # the config hash (hex) the rows were built under
    config_flag: str = ""  # set when one table mixes config hashes
    attempts: int = 0  # runs recorded for the scored slots (more than n: infra retries)
    # Coverage (scorer 1.1.0 on): the row's slots by what their final run gave. ``expected``
    # = ``answered`` + sum(``unanswered``) + ``never_run``; ``unanswered`` counts by outcome
    # (or `ENCODERS_UNMET`). A row with a slot never run is ``partial``.
    task_set: str = ""  # hex: the task set hash the row was scored on
    expected: int = 0
    answered: int = 0
    unanswered: dict[str, int] = {}
    never_run: int = 0
    partial: bool = False
    runner: str = ""  # the runs' runner, or "mixed: a, b"
    isolation: str = ""  # the runs' isolation, or "mixed: none, container"
    run_flag: str = ""  # set when the row's runs, or rows of one pair and arm, mix them


class Result(Record, frozen=True, kw_only=True):
    """A score: links everything it was computed from."""

    __kind__ = "medomni.result"

    task_set: ObjectId
    set_build: ObjectId
    jobs: tuple[ObjectId, ...]
    answer_keys: tuple[ObjectId, ...]
    scorer: str
    scorer_version: str
    n_boot: int
    seed: int
    rows: tuple[ScoreRow, ...]
    table: ObjectId  # blob: the rows as Parquet
    answer_columns: tuple[ObjectId, ...] = ()  # the `AnswerColumns` scored against
    #: Set when some expected slot had no final run and the user allowed it
    #: (``--allow-partial``): the rows say which.
    partial: bool = False
    #: The arm labels scored when the user chose some (``--arm``); empty: every arm of the set.
    arms: tuple[str, ...] = ()
