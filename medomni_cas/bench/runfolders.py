"""Run folders: a job's records written out as files, and read back in.

``<runs>/<set>--<agent>--<arm>[.<variant>]--r<rep>--<stamp>/`` holds::

    job.json               the job record (with its id)
    runs.jsonl             one run record per atom task (the slot's final run), with its id
    predictions.jsonl      the prediction records, with their ids
    encoder_use.jsonl      each encoder call, with its run (arms with the perception service)
    trials/<run_id>/       the answer as written (answer.bin) and the trial's log files

The folder is a view: the store is the truth, and writing it again gives the same bytes.
`import_run_folder` reads one back into a store (another machine's, say), re-hashing every
record against the id written beside it, so nothing altered on the way is accepted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from medomni_cas.bench.records import JobRecord, PredictionRecord, RunRecord
from medomni_cas.errors import IntegrityError, InvalidObject, MedomniError
from medomni_cas.store import encoding
from medomni_cas.store.backends._files import atomic_write
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


def _line(oid: ObjectId, record: msgspec.Struct, **extra: str) -> bytes:
    body = msgspec.json.decode(_JSON.encode(record))
    return _JSON.encode({"id": oid.hex(), **extra, "record": body}) + b"\n"


def write_run_folder(store: Store, job_id: ObjectId, folder: Path) -> Path:
    """Write the view of job ``job_id`` into ``folder`` (files are replaced whole)."""
    job = store.get(job_id, JobRecord)
    folder.mkdir(parents=True, exist_ok=True)
    runs, preds, calls = [], [], []
    for rid, run in store.get_many(job.runs, RunRecord):
        runs.append(_line(rid, run))
        for pid, p in store.get_many(run.predictions, PredictionRecord):
            preds.append(_line(pid, p))
        if run.agent_block.encoder_log is not None:
            for line in store.read_blob(run.agent_block.encoder_log).splitlines():
                calls.append(
                    _JSON.encode({"run_id": run.run_id, "call": msgspec.json.decode(line)}) + b"\n"
                )
        trial = folder / "trials" / run.run_id
        trial.mkdir(parents=True, exist_ok=True)
        if run.answer is not None:
            _write(trial / "answer.bin", store.read_blob(run.answer))
        if run.logs is not None:
            for name, oid in store.get(run.logs).items():
                _write(trial / name, store.read_blob(oid))
    _write(folder / "job.json", _line(job_id, job))
    _write(folder / "runs.jsonl", b"".join(runs))
    _write(folder / "predictions.jsonl", b"".join(preds))
    if calls or job.arm != "no-perception":
        _write(folder / "encoder_use.jsonl", b"".join(calls))
    return folder


def _write(path: Path, data: bytes) -> None:
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return  # unchanged: leave its timestamps alone
    atomic_write(path, data, durable=False)


def _records[T: msgspec.Struct](path: Path, cls: type[T]) -> list[tuple[ObjectId, T, bytes]]:
    out = []
    if not path.is_file():
        raise RunFolderError(f"{path}: missing")
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = msgspec.json.decode(line)
            oid = ObjectId.from_hex(doc["id"])
            record = msgspec.convert(doc["record"], cls, dec_hook=_dec_hook)
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError) as e:
            raise RunFolderError(f"{path}:{n}: not a {cls.__name__} line: {e}") from None
        data = encoding.encode(record)  # type: ignore[arg-type]
        if hash_bytes(data) != oid:
            raise RunFolderError(
                f"{path}:{n}: the record does not hash to its id {oid} (edited or damaged)"
            )
        out.append((oid, record, data))
    return out


def import_run_folder(store: Store, folder: str | os.PathLike[str]) -> ObjectId:
    """Read a run folder into ``store``; every record and blob is checked before any is
    written. Returns the job's id."""
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
    blobs: list[bytes] = []
    for _, run, _ in runs:
        check_entry_name(run.run_id)
        trial = f / "trials" / run.run_id
        if run.answer is not None:
            data = _read(trial / "answer.bin")
            if _blob_id(data) != run.answer:
                raise RunFolderError(
                    f"{trial / 'answer.bin'}: not the answer run {run.run_id} recorded"
                )
            blobs.append(data)
    for data in blobs:
        store.put_blob(data)
    items = [(oid, data) for oid, _, data in (*preds, *runs)] + [(job_id, job_data)]
    try:
        store.put_raw_many(items)
    except (IntegrityError, InvalidObject) as e:
        raise RunFolderError(f"{f}: {e}") from None
    return job_id


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise RunFolderError(f"{path}: missing")
    return path.read_bytes()


def _blob_id(data: bytes) -> ObjectId:
    # the id put_blob would give, chunked or not, without touching the real store
    from medomni_cas.store.backends.memory import MemoryBackend

    return Store(MemoryBackend()).put_blob(data)
