"""Predictions and answers as columns, lined up row for row.

Each arm (and rung) of a set build has one row order, its *key*: for each entry of the build
under the arm, in the build's order, for each target of the entry's build config, every atom
of the entry in cohort order. A job's predictions (`PredictionColumns`, which the harness
writes) and the arm's answers (`AnswerColumns`, which the scorer derives from the answer
keys) both follow it, and each column is its own blob: an Arrow IPC stream of that column.
Two things follow:

* a reader reads only the columns it needs: the scorer reads a job's answers, not its
  atoms, run ids and outcomes (a few bytes a row instead of hundreds);
* equal columns are one object: the ``atom``, ``target`` and ``pair`` columns of every job
  of an arm are the answer columns' own, so the scorer proves that a job lines up with the
  key by comparing ids, without a join.

The bytes of a column are pyarrow's IPC writer's, and another pyarrow version may write
other bytes for the same values: jobs written then no longer share the key's ids, and the
scorer joins them on (atom, target) instead. Scores never depend on the bytes; speed does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import msgspec
import numpy as np
import pyarrow as pa

from medomni_cas.bench.records import (
    ENCODERS_UNMET,
    AgentConfig,
    AnswerColumns,
    AnswerGroup,
    JobRecord,
    PredictionColumns,
    PredictionRecord,
    PredictionTable,
    RunRecord,
)
from medomni_cas.bench.refnames import answers_ref
from medomni_cas.bench.schemas import PREDICTION_COLUMNS, PREDICTION_SCHEMA
from medomni_cas.errors import InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNK_SIZE
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import (
    AnswerKey,
    BuildConfig,
    BuildResult,
    Content,
    SetBuild,
    SetEntry,
)

__all__ = [
    "KEY_COLUMNS",
    "PREDICTION_COLUMNS",
    "PREDICTION_SCHEMA",
    "SLOT_COLUMNS",
    "ArmRows",
    "ColumnsError",
    "KeyGroup",
    "Truths",
    "answer_columns",
    "arm_rows",
    "arm_slots",
    "column_bytes",
    "make_answer_columns",
    "prediction_columns",
    "put_columns",
    "read_column",
    "read_or_nulls",
    "read_predictions",
]

#: Columns of the key, the same objects in a job's predictions and its arm's answers.
KEY_COLUMNS = ("atom", "target", "pair")

# A handful of values per job: stored dictionary-encoded (4 bytes a row, not 64 for a hex id).
_DICTIONARY = frozenset(
    {"target", "pair", "intelligence", "config", "outcome", "status", "runner", "isolation"}
)
#: Columns of each key row's slot beyond `PREDICTION_COLUMNS` (jobs recorded before them lack
#: them): ``status`` is "answered" when the final run's answer is scored, else its outcome or
#: `ENCODERS_UNMET`; ``runner`` and ``isolation`` are the run's.
SLOT_COLUMNS = ("status", "runner", "isolation")
# Constant per job, so kept in the `JobRecord` and not stored as columns.
_FROM_JOB = ("agent", "arm", "arm_variant", "repetition")


class ColumnsError(MedomniError, ValueError):
    """A set build or a job whose rows cannot be laid out, or a column blob that is not one."""


# -- the key ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyGroup:
    """Rows ``start:stop`` of the key: one entry's atoms for one target."""

    entry: SetEntry
    content: ObjectId
    answer_key: ObjectId
    atoms: bytes  # the entry's atom ids, 32 bytes each, in cohort order
    target: str
    metric: str
    start: int
    stop: int


@dataclass(frozen=True)
class ArmRows:
    """The row order of one arm (and rung) of a set build: the module docstring's *key*."""

    set_build: ObjectId
    arm: str
    arm_variant: str
    groups: tuple[KeyGroup, ...]

    @property
    def label(self) -> str:
        return arm_label(self.arm, self.arm_variant)

    @property
    def rows(self) -> int:
        return self.groups[-1].stop if self.groups else 0

    def row_atoms(self) -> Iterable[tuple[KeyGroup, ObjectId]]:
        """Each row's group and atom, in row order."""
        for g in self.groups:
            for i in range(0, len(g.atoms), 32):
                yield g, ObjectId(g.atoms[i : i + 32])

    @cached_property
    def arrays(self) -> dict[str, pa.Array]:
        """The key columns: every row's atom (hex), target and pair."""
        sizes = [g.stop - g.start for g in self.groups]
        return {
            "atom": _hex_array(b"".join(g.atoms for g in self.groups)),
            "target": _runs_array([g.target for g in self.groups], sizes),
            "pair": _runs_array([g.entry.pair for g in self.groups], sizes),
        }


class _BuildView(encoding.View):
    """What the key needs of a `BuildResult`; its atoms left as their msgpack bytes."""

    __kind__ = BuildResult.__kind__
    __version__ = BuildResult.__version__

    content: ObjectId
    answer_key: ObjectId
    atoms: msgspec.Raw


def _build_atoms(store: Store, result: ObjectId) -> tuple[ObjectId, ObjectId, bytes]:
    """A build's content, answer key and atom ids (concatenated), read without making an
    object per atom."""
    try:
        view = encoding.decode_view(store.get_raw(result), _BuildView)
        atoms = encoding.link_array(view.atoms)
    except InvalidObject as e:
        raise InvalidObject(f"build {result}: {e}") from None
    return view.content, view.answer_key, atoms


def arm_slots(store: Store, set_build: ObjectId, arm: str, arm_variant: str = "") -> int:
    """How many atom tasks (run slots of one job) ``arm`` (and rung) has in ``set_build``."""
    sb = store.get(set_build, SetBuild)
    return sum(
        len(_build_atoms(store, e.result)[2]) // 32
        for e in sb.entries
        if (e.arm, e.arm_variant) == (arm, arm_variant)
    )


def arm_rows(store: Store, set_build: ObjectId, arm: str, arm_variant: str = "") -> ArmRows:
    """The key of ``arm`` (and rung ``arm_variant``) in ``set_build``."""
    sb = store.get(set_build, SetBuild)
    entries = [e for e in sb.entries if (e.arm, e.arm_variant) == (arm, arm_variant)]
    if not entries:
        raise ColumnsError(f"set build {set_build} has no arm {arm_label(arm, arm_variant)}")
    groups: list[KeyGroup] = []
    start = 0
    configs: dict[ObjectId, BuildConfig] = {}
    for e in entries:
        content, answer_key, atoms = _build_atoms(store, e.result)
        cfg = configs.get(e.config)
        if cfg is None:
            cfg = configs[e.config] = store.get(e.config, BuildConfig)
        for t in cfg.targets:
            stop = start + len(atoms) // 32
            groups.append(
                KeyGroup(
                    e, content, answer_key, atoms, str(t["label"]), str(t["metric"]), start, stop
                )
            )
            start = stop
    return ArmRows(set_build, arm, arm_variant, tuple(groups))


def _hex_array(ids: bytes) -> pa.Array:
    """The 64-character hex of each 32-byte id in ``ids`` (their concatenation)."""
    n = len(ids) // 32
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 64).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(ids.hex().encode())])


def _runs_array(values: Sequence[str], sizes: Sequence[int]) -> pa.Array:
    """``values[i]`` repeated ``sizes[i]`` times, dictionary-encoded in first-seen order."""
    dictionary = list(dict.fromkeys(values))
    codes = np.repeat(np.array([dictionary.index(v) for v in values], dtype=np.int32), sizes)
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(dictionary, pa.string()))


# -- column blobs ---------------------------------------------------------------------------
def column_bytes(name: str, array: pa.Array) -> bytes:
    """One column as an Arrow IPC stream of one record batch."""
    batch = pa.record_batch([array], names=[name])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def put_columns(store: Store, arrays: dict[str, pa.Array]) -> dict[str, ObjectId]:
    """Store each column that is not null throughout (the key's always) as its own blob;
    the small ones in one batch (on a remote store one pack, not a request each)."""
    out = {}
    small: list[tuple[ObjectId | None, bytes]] = []
    for name, array in arrays.items():
        if name not in KEY_COLUMNS and array.null_count == len(array):
            continue
        if name in _DICTIONARY and not pa.types.is_dictionary(array.type):
            array = array.dictionary_encode()
        data = column_bytes(name, array)
        if len(data) > CHUNK_SIZE:
            out[name] = store.put_blob(data)  # chunked: its chunks are written first
            continue
        oid, raw = blob_object(data)
        small.append((oid, raw))
        out[name] = oid
    store.put_raw_many(small)
    return out


def read_column(store: Store, blob: ObjectId, name: str, *, plain: bool = True) -> pa.Array:
    """Column ``name`` from its blob (verified); dictionaries decoded unless not ``plain``."""
    data = store.read_blob(blob)
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise InvalidObject(f"column {name!r} (blob {blob}) is not an Arrow stream: {e}") from None
    if table.column_names != [name]:
        raise InvalidObject(f"blob {blob} holds columns {table.column_names}, not {name!r}")
    column = table.column(0)
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if plain and pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def read_or_nulls(
    store: Store, columns: dict[str, ObjectId], name: str, rows: int, typ: pa.DataType
) -> pa.Array:
    """Column ``name`` of a table of ``columns``: a column not stored is null in every row."""
    blob = columns.get(name)
    return pa.nulls(rows, typ) if blob is None else read_column(store, blob, name)


# -- a job's predictions --------------------------------------------------------------------
def prediction_columns(
    store: Store, key: ArmRows, runs: Sequence[RunRecord], intelligence: str
) -> PredictionColumns:
    """A job's final ``runs`` as columns in ``key``'s rows (stored), nulls where none ran.

    The values of a run whose answer is not scored (one that does not meet its arm) are
    left null, so every reader of the columns scores it as unanswered."""
    by_atom = {r.atom: r for r in runs}
    values: dict[tuple[ObjectId, str], PredictionRecord] = {}
    ids = [p for r in runs for p in r.predictions]
    for _, p in store.get_many(ids, PredictionRecord):
        values[(p.atom, p.target)] = p
    cols: dict[str, list[object]] = {
        c: []
        for c in (
            "run_id",
            "slot",
            "value_text",
            "value_num",
            "intelligence",
            "config",
            "outcome",
            "attempt",
            "scores",
            *SLOT_COLUMNS,
        )
    }
    for g, atom in key.row_atoms():
        run = by_atom.get(atom)
        status: str | None = None if run is None else run.outcome
        if status == "answered" and run is not None and not run.agent_block.meets_arm:
            status = ENCODERS_UNMET
        p = values.get((atom, g.target)) if status == "answered" else None
        v = p.value if p is not None else None
        cols["status"].append(status)
        cols["runner"].append(run.runner if run else None)
        cols["isolation"].append(run.isolation if run else None)
        cols["run_id"].append(run.run_id if run else None)
        cols["slot"].append(run.slot if run else None)
        cols["value_text"].append(v if isinstance(v, str) else None)
        cols["value_num"].append(float(v) if isinstance(v, int | float) else None)
        cols["intelligence"].append(intelligence if run else None)
        cols["config"].append(run.config.hex() if run else None)
        cols["outcome"].append(run.outcome if run else None)
        cols["attempt"].append(run.attempt if run else None)
        scores = p.scores if p is not None else None
        cols["scores"].append(msgspec.json.encode(scores).decode() if scores else None)
    arrays = dict(key.arrays)
    types = {c: pa.string() for c in SLOT_COLUMNS}
    arrays.update(
        {c: pa.array(v, types.get(c) or PREDICTION_SCHEMA.field(c).type) for c, v in cols.items()}
    )
    return PredictionColumns(rows=key.rows, columns=put_columns(store, arrays))


def read_predictions(store: Store, job: JobRecord, *, extra: Sequence[str] = ()) -> pa.Table:
    """A job's predictions with `PREDICTION_COLUMNS` (and the ``extra`` of `SLOT_COLUMNS`,
    null where the job did not record them), from either layout: one row per prediction
    made or, in `PredictionColumns`, per key row that has a run."""
    record = store.get(job.predictions)
    if isinstance(record, PredictionTable):
        data = store.read_blob(record.table)
        table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
        if "scores" not in table.column_names:  # tables written before scores were kept
            table = table.append_column("scores", pa.nulls(table.num_rows, pa.string()))
        table = table.select(list(PREDICTION_COLUMNS)).cast(PREDICTION_SCHEMA)
        for name in extra:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
        return table
    if not isinstance(record, PredictionColumns):
        kind = record.__kind__ if isinstance(record, Record) else type(record).__name__
        raise InvalidObject(f"job {job.name}: predictions {job.predictions} is a {kind}")
    n = record.rows
    agent = store.get(job.agent_config, AgentConfig).name
    constant = {
        "agent": agent,
        "arm": job.arm,
        "arm_variant": job.arm_variant,
        "repetition": job.repetition,
    }
    arrays = []
    for field in PREDICTION_SCHEMA:
        if field.name in _FROM_JOB:
            arrays.append(pa.array([constant[field.name]] * n, field.type))
        else:
            arrays.append(read_or_nulls(store, record.columns, field.name, n, field.type))
    schema = PREDICTION_SCHEMA
    for name in extra:
        column = read_or_nulls(store, record.columns, name, n, pa.string())
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        arrays.append(column)
        schema = schema.append(pa.field(name, pa.string()))
    table = pa.Table.from_arrays(arrays, schema=schema)
    return table.filter(table["run_id"].is_valid())


# -- an arm's answers -----------------------------------------------------------------------
#: Truth columns already made, by (answer key, content, target): arms share them.
Truths = dict[tuple[ObjectId, ObjectId, str], tuple[pa.Array, pa.Array]]


def make_answer_columns(
    store: Store, key: ArmRows, truths: Truths | None = None, *, sink: Store | None = None
) -> AnswerColumns:
    """The answers of ``key``'s rows, from the answer keys of its builds, with the columns
    stored in ``sink`` (``store`` unless given: a check makes them in a scratch store).
    ``truths`` keeps what was read for the next arm: the encoder arms share their keys."""
    truths = {} if truths is None else truths
    text: list[pa.Array] = []
    num: list[pa.Array] = []
    groups = []
    for g in key.groups:
        made = truths.get((g.answer_key, g.content, g.target))
        if made is None:
            made = truths[(g.answer_key, g.content, g.target)] = _truth(store, g)
        if len(made[0]) != g.stop - g.start:
            raise ColumnsError(
                f"build {g.entry.result} ({g.entry.pair} {key.label}): {g.stop - g.start} "
                f"atoms but its content {g.content} has {len(made[0])} patients"
            )
        groups.append(
            AnswerGroup(
                pair=g.entry.pair,
                target=g.target,
                metric=g.metric,
                config=g.entry.config,
                numeric=made[1].null_count < len(made[1]),
                start=g.start,
                stop=g.stop,
            )
        )
        text.append(made[0])
        num.append(made[1])
    arrays = dict(key.arrays)
    arrays["truth_text"] = pa.concat_arrays(text) if text else pa.array([], pa.string())
    arrays["truth_num"] = pa.concat_arrays(num) if num else pa.array([], pa.float64())
    return AnswerColumns(
        set_build=key.set_build,
        arm=key.arm,
        arm_variant=key.arm_variant,
        answer_keys=tuple(dict.fromkeys(g.answer_key for g in key.groups)),
        rows=key.rows,
        groups=tuple(groups),
        columns=put_columns(store if sink is None else sink, arrays),
    )


def _truth(store: Store, g: KeyGroup) -> tuple[pa.Array, pa.Array]:
    """One target's answers for a content's patients, in cohort order: as text and as
    numbers (each null where the answer is the other kind, or missing)."""
    values = store.get(g.answer_key, AnswerKey).values
    answers = [values.get(p, {}).get(g.target) for p in _patients(store, g.content)]
    return (
        pa.array([v if isinstance(v, str) else None for v in answers], pa.string()),
        pa.array([float(v) if isinstance(v, int | float) else None for v in answers], _F64),
    )


_F64 = pa.float64()


class _Patients(encoding.View):
    """What the answers need of a `Content`: the rest is skipped undecoded."""

    __kind__ = Content.__kind__
    __version__ = Content.__version__

    patients: tuple[str, ...]


def _patients(store: Store, content: ObjectId) -> tuple[str, ...]:
    try:
        return encoding.decode_view(store.get_raw(content), _Patients).patients
    except InvalidObject as e:
        raise InvalidObject(f"content {content}: {e}") from None


def answer_columns(
    store: Store,
    set_build: ObjectId,
    arm: str,
    arm_variant: str = "",
    truths: Truths | None = None,
) -> tuple[ObjectId, AnswerColumns]:
    """The arm's `AnswerColumns`: the one the store keeps for it, else made and kept."""
    ref = answers_ref(set_build, arm_label(arm, arm_variant))
    aid = store.refs.get(ref)
    if aid is not None:
        found = store.get(aid, AnswerColumns)
        if (found.set_build, found.arm, found.arm_variant) == (set_build, arm, arm_variant):
            return aid, found
    made = make_answer_columns(store, arm_rows(store, set_build, arm, arm_variant), truths)
    mid = store.put(made)
    if aid != mid:
        # harnesses and scorers may race here; any of them writes the same object
        store.refs.update(ref, lambda _cur: mid, message="answer columns")
    return mid, made
