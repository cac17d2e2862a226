"""Run folders: a job's records written out as files, and read back in.

``<runs>/<set>--<agent>--<arm>[.<variant>]--r<rep>--<stamp>/`` holds::

    job.json               the job record (with its id)
    agent.json             the agent config the job ran
    runs.jsonl             one run record per atom task (the slot's final run), with its id
    predictions.jsonl      the prediction records, with their ids
    encoder_use.jsonl      each encoder call, with its run and level (only on arms that
                           attach the perception service)
    columns.json           the job's predictions as columns (the record), and in
    columns/<name>.arrow   each column, an Arrow IPC stream
    trials/<run_id>/       the answer as written (answer.bin) and the trial's log files
    report.json            the last `bench run`'s report of the job (the harness writes it:
                           not a record, and not read back)

The folder is a view: the store is the truth, and writing it again gives the same bytes.
Every line holds every field of its record, those at their default too (``"errors": []``,
``"cost_usd": null``, ``"encoder_calls": 0``), and lists those in ``"defaults"``: a record's
bytes leave a default out, and reading the line back leaves them out again, so that it
hashes to its id (folders written before spelled no default, and hold no such list).
`import_run_folder` reads one back into a store (another machine's, say), re-hashing every
record, blob and tree against the id it must have, so nothing altered on the way is
accepted; what the job made comes back whole (the set it ran must be in the store to score
it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect

from medomni_cas.bench.encoder_calls import EncoderCall
from medomni_cas.bench.records import (
    AgentConfig,
    JobRecord,
    PredictionColumns,
    PredictionRecord,
    PredictionTable,
    RunRecord,
)
from medomni_cas.errors import IntegrityError, InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.files import atomic_write
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.store import Store
from medomni_cas.store.trees import check_entry_name

__all__ = ["RunFolderError", "import_run_folder", "write_run_folder"]


class RunFolderError(MedomniError, ValueError):
    """A run folder that cannot be read back: the message names the file and line."""


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, ObjectId):
        return obj.hex()
    raise NotImplementedError(type(obj).__name__)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is ObjectId and isinstance(obj, str):
        return ObjectId.from_hex(obj)
    raise NotImplementedError(tp)


_JSON = msgspec.json.Encoder(enc_hook=_enc_hook, order="sorted")


def _spelled(record: msgspec.Struct, body: dict[str, Any], path: str, left: list[str]) -> Any:
    """``body`` (``record`` as its encoding gives it, defaults left out) with every field
    spelled, the default ones too; their paths go to ``left``."""
    cls = type(record)
    missing = sorted(_defaults(cls).keys() - body.keys())
    if missing:
        body = {**_defaults(cls), **body}
        left += [path + name for name in missing]
    for name, many in _nested(cls):
        if name not in missing and body.get(name) is not None:
            value = getattr(record, name)
            if many:
                body[name] = [
                    _spelled(v, b, f"{path}{name}.{i}.", left)
                    for i, (v, b) in enumerate(zip(value, body[name], strict=True))
                ]
            else:
                body[name] = _spelled(value, body[name], f"{path}{name}.", left)
    return body


@functools.cache
def _defaults(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """Each field's default as JSON builtins (a field left out of a record's bytes has it)."""
    out = {}
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            out[f.name] = msgspec.json.decode(_JSON.encode(f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.name] = msgspec.json.decode(_JSON.encode(f.default_factory()))
    return out


@functools.cache
def _nested(cls: type[msgspec.Struct]) -> tuple[tuple[str, bool], ...]:
    """The fields of ``cls`` that hold structs: (name, True for a tuple of them)."""
    out = []
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        t = f.type
        if isinstance(t, msgspec.inspect.UnionType):  # X | None
            t = next((u for u in t.types if not isinstance(u, msgspec.inspect.NoneType)), t)
        if isinstance(t, msgspec.inspect.StructType):
            out.append((f.name, False))
        elif isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType) and isinstance(
            t.item_type, msgspec.inspect.StructType
        ):
            out.append((f.name, True))
    return tuple(out)


def _unspelled(body: dict[str, Any], left: list[str]) -> dict[str, Any]:
    """``body`` without the fields `_spelled` added (each path in ``left``), so the record
    decodes to what it was: a value equal to a field's default is not always left out of
    the record's bytes, so defaults cannot be told from the values alone."""
    for path in left:
        *parents, name = path.split(".")
        at: Any = body
        for part in parents:
            at = at[int(part)] if isinstance(at, list) else at[part]
        at.pop(name)
    return body


def _line(oid: ObjectId, record: msgspec.Struct, **extra: str) -> bytes:
    left: list[str] = []
    body = _spelled(record, msgspec.json.decode(_JSON.encode(record)), "", left)
    doc: dict[str, Any] = {"id": oid.hex(), **extra, "record": body}
    if left:
        doc["defaults"] = left
    return _JSON.encode(doc) + b"\n"


def write_run_folder(store: Store, job_id: ObjectId, folder: Path) -> Path:
    """Write the view of job ``job_id`` into ``folder`` (files are replaced whole)."""
    job = store.get(job_id, JobRecord)
    folder.mkdir(parents=True, exist_ok=True)
    runs, preds, calls = [], [], []
    attached = False  # an arm of the job attaches the perception service
    for rid, run in store.get_many(job.runs, RunRecord):
        runs.append(_line(rid, run))
        attached = attached or run.agent_block.encoders != "none"
        for pid, p in store.get_many(run.predictions, PredictionRecord):
            preds.append(_line(pid, p))
        if run.agent_block.encoder_log is not None:
            for line in store.read_blob(run.agent_block.encoder_log).splitlines():
                # the call's bytes as logged, so that the log can be made again on import
                level = _CALL.decode(line).level
                use = _Use(run_id=run.run_id, level=level, call=msgspec.Raw(line))
                calls.append(_JSON.encode(use) + b"\n")
        trial = folder / "trials" / run.run_id
        trial.mkdir(parents=True, exist_ok=True)
        if run.answer is not None:
            _write(trial / "answer.bin", store.read_blob(run.answer))
        if run.logs is not None:
            for name, oid in store.get(run.logs).items():
                _write(trial / name, store.read_blob(oid))
    _write(folder / "job.json", _line(job_id, job))
    _write(folder / "agent.json", _line(job.agent_config, store.get(job.agent_config, AgentConfig)))
    _write(folder / "runs.jsonl", b"".join(runs))
    _write(folder / "predictions.jsonl", b"".join(preds))
    # calls logged on an arm without the service fail their run (`meets_arm`); they are
    # written all the same, so that the folder imports whole
    if attached or calls:
        _write(folder / "encoder_use.jsonl", b"".join(calls))
    table = store.get(job.predictions)
    _write(folder / "columns.json", _line(job.predictions, table))
    for name, blob in _table_blobs(table).items():
        _write(folder / "columns" / f"{name}.arrow", store.read_blob(blob))
    return folder


class _Use(msgspec.Struct, kw_only=True):
    """A line of ``encoder_use.jsonl``: the run, the call's level (`EncoderCall.level`; ""
    in folders written before, and for calls logged before calls had one) and the call."""

    run_id: str
    level: str = ""
    call: msgspec.Raw


_CALL = msgspec.json.Decoder(EncoderCall)


def _table_blobs(table: object) -> dict[str, ObjectId]:
    if isinstance(table, PredictionColumns):
        return dict(table.columns)
    if isinstance(table, PredictionTable):
        return {"table": table.table}
    raise RunFolderError(f"the job's predictions are a {type(table).__name__}")


def _write(path: Path, data: bytes) -> None:
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return  # unchanged: leave its timestamps alone
    atomic_write(path, data, durable=False)


def _records[T: encoding.Record](path: Path, cls: type[T]) -> list[tuple[ObjectId, T, bytes]]:
    out = []
    if not path.is_file():
        raise RunFolderError(f"{path}: missing")
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = msgspec.json.decode(line)
            oid = ObjectId.from_hex(doc["id"])
            body = _unspelled(doc["record"], doc.get("defaults", []))
            record = msgspec.convert(body, cls, dec_hook=_dec_hook)
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            KeyError,
            IndexError,
            AttributeError,
            TypeError,
            ValueError,
        ) as e:
            raise RunFolderError(f"{path}:{n}: not a {cls.__name__} line: {e}") from None
        data = encoding.encode(record)
        if hash_bytes(data) != oid:
            raise RunFolderError(
                f"{path}:{n}: the record does not hash to its id {oid} (edited or damaged)"
            )
        out.append((oid, record, data))
    return out


def import_run_folder(store: Store, folder: str | os.PathLike[str]) -> ObjectId:
    """Read a run folder into ``store``; every record, blob and tree is checked against the
    id it must have before any is written. Returns the job's id."""
    f = Path(folder)
    jobs = _records(f / "job.json", JobRecord)
    if len(jobs) != 1:
        raise RunFolderError(f"{f / 'job.json'}: expected one job record")
    job_id, job, job_data = jobs[0]
    runs = _records(f / "runs.jsonl", RunRecord)
    preds = _records(f / "predictions.jsonl", PredictionRecord)
    have_runs = {oid for oid, _, _ in runs}
    missing = [r for r in job.runs if r not in have_runs]
    if missing:
        raise RunFolderError(f"{f / 'runs.jsonl'}: run {missing[0]} of the job is not in it")
    # Everything is made in a scratch store first: what hashes right there is copied over.
    scratch = Store(MemoryBackend())
    records = [(oid, data) for oid, _, data in (*preds, *runs)] + [(job_id, job_data)]
    if (f / "agent.json").is_file():  # folders written before it held the agent config
        records += [(oid, data) for oid, _, data in _records(f / "agent.json", AgentConfig)]
    uses = _encoder_uses(f / "encoder_use.jsonl")
    for _, run, _ in runs:
        _trial(scratch, f, run, uses.get(run.run_id, []))
    if (f / "columns.json").is_file():
        _columns(scratch, f, job)
    try:
        scratch.put_raw_many(records)
        store.put_raw_many([(oid, scratch.get_raw(oid)) for oid in scratch.iter_ids()])
    except (IntegrityError, InvalidObject) as e:
        raise RunFolderError(f"{f}: {e}") from None
    return job_id


def _trial(scratch: Store, f: Path, run: RunRecord, calls: list[bytes]) -> None:
    """A run's answer, log files and encoder call log, checked against its record."""
    check_entry_name(run.run_id)
    trial = f / "trials" / run.run_id
    if run.answer is not None and scratch.put_blob(_read(trial / "answer.bin")) != run.answer:
        raise RunFolderError(f"{trial / 'answer.bin'}: not the answer run {run.run_id} recorded")
    if run.logs is not None:
        if not trial.is_dir():
            raise RunFolderError(f"{trial}: missing (run {run.run_id} kept logs)")
        files = sorted(p for p in trial.iterdir() if p.name != "answer.bin" and p.is_file())
        tree = scratch.put_tree({p.name: scratch.put_blob(p.read_bytes()) for p in files})
        if tree != run.logs:
            raise RunFolderError(f"{trial}: its log files are not the logs run {run.run_id} kept")
    log = run.agent_block.encoder_log
    if log is not None and scratch.put_blob(b"".join(c + b"\n" for c in calls)) != log:
        raise RunFolderError(
            f"{f / 'encoder_use.jsonl'}: the calls of run {run.run_id} are not the ones it logged"
        )


def _encoder_uses(path: Path) -> dict[str, list[bytes]]:
    """Each run's encoder calls, as logged."""
    out: dict[str, list[bytes]] = {}
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            use = msgspec.json.decode(line, type=_Use)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise RunFolderError(f"{path}:{n}: not an encoder call line: {e}") from None
        out.setdefault(use.run_id, []).append(bytes(use.call))
    return out


def _columns(scratch: Store, f: Path, job: JobRecord) -> None:
    """The job's prediction table: its record and every column file, each checked."""
    path = f / "columns.json"
    one_blob = b'"table":' in path.read_bytes()  # jobs written before columns: one Arrow blob
    found = _records(path, PredictionTable if one_blob else PredictionColumns)
    if len(found) != 1:
        raise RunFolderError(f"{path}: expected one record")
    oid, table, data = found[0]
    if oid != job.predictions:
        raise RunFolderError(f"{path}: not the predictions of job {job.name}")
    for name, blob in _table_blobs(table).items():
        check_entry_name(f"{name}.arrow")
        column = f / "columns" / f"{name}.arrow"
        if scratch.put_blob(_read(column)) != blob:
            raise RunFolderError(f"{column}: not the column the job's predictions hold")
    scratch.put_raw_many([(oid, data)])


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise RunFolderError(f"{path}: missing")
    return path.read_bytes()
