"""What the viewer reads from a store: pages of refs and runs, objects by kind, previews.

Every query reads only what its page shows. A job's runs are a list of links inside its
`JobRecord` (100,000 of them in a large job): `job_head` decodes the record with that list
left as its msgpack bytes, and `run_page` cuts the page's 50 links out of those bytes, so a
page of a 100,000-run job reads one job record and 50 run records, never all of them.

Nothing here writes: the viewer opens its store without creating one and only reads.

Answer keys
    What an agent must never see is an `AnswerKey`, the truth columns of an arm's
    `AnswerColumns` (derived from the keys) and the salts of an answer commitment. `Hidden`
    finds those objects so that the pages can refuse them unless the viewer was started
    with ``--show-answer-keys``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from medomni_cas.bench.records import AnswerColumns, JobRecord, Result, RunRecord
from medomni_cas.bench.refnames import ANSWER_REFS, RESULT_REFS
from medomni_cas.errors import InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, LINK_MARK
from medomni_cas.store.ids import ID_SIZE, ObjectId
from medomni_cas.store.objects import CHUNKED, ChunkedBlob
from medomni_cas.store.store import Store
from medomni_cas.studio.records import AnswerKey, AtomTask, BuildResult

__all__ = [
    "ANSWER_KINDS",
    "MAX_LIMIT",
    "PAGE",
    "TRUTH_COLUMNS",
    "Hidden",
    "JobHead",
    "Preview",
    "build_atom_count",
    "clamp",
    "job_head",
    "kind_of",
    "link_slice",
    "patients",
    "preview",
    "ref_page",
    "run_page",
]

#: Rows a page shows unless asked for another number, and the most it shows.
PAGE = 50
MAX_LIMIT = 500
#: Record kinds that are answers, or open them: shown only with ``--show-answer-keys``. The
#: salts of an answer commitment (`medomni_cas.studio.commitments.AnswerSalts`) are its
#: secret half: with them a five-class answer is found from its public leaf in five tries.
ANSWER_KINDS = frozenset({AnswerKey.__kind__, "medomni.answer-salts"})
#: Columns of an `AnswerColumns` that hold the answers (the others are the key's ids).
TRUTH_COLUMNS = ("truth_text", "truth_num")
#: Bytes of a blob shown on a page; the rest is counted.
PREVIEW_BYTES = 256 << 10

_ITEM = len(LINK_MARK) + ID_SIZE  # one link in canonical bytes


def clamp(offset: int, limit: int) -> tuple[int, int]:
    """A page's offset and size kept in range (a query string is user input)."""
    return max(0, offset), min(max(1, limit), MAX_LIMIT)


def ref_page(
    store: Store, prefix: str, offset: int, limit: int
) -> tuple[list[tuple[str, ObjectId]], int]:
    """Refs under ``prefix`` in name order: those of the page, and how many there are."""
    items = store.refs.items(prefix)
    page = list(itertools.islice(items, offset, offset + limit))
    total = offset + len(page) + sum(1 for _ in items)
    return page, total


def kind_of(store: Store, oid: ObjectId) -> str:
    return encoding.kind_of(store.get_raw(oid))[0]


# -- jobs and their runs ------------------------------------------------------------------------
class JobHead(encoding.View, kw_only=True):
    """A `JobRecord` with its runs left as the bytes of their msgpack array of links."""

    __kind__ = JobRecord.__kind__
    __version__ = JobRecord.__version__

    name: str
    task_set: ObjectId
    set_build: ObjectId
    agent_config: ObjectId
    arm: str
    arm_variant: str = ""
    repetition: int
    runner: str
    runs: msgspec.Raw = msgspec.Raw(b"\x90")
    attempts: int
    predictions: ObjectId
    started: str

    @property
    def run_count(self) -> int:
        return _array_head(bytes(memoryview(self.runs)[:5]))[0]


def job_head(store: Store, oid: ObjectId) -> JobHead:
    """A job's fields, its runs not decoded (`run_page` reads a page of them)."""
    return encoding.decode_view(store.get_raw(oid), JobHead)


def _array_head(raw: bytes) -> tuple[int, int]:
    """(items, where the first starts) of the msgpack array at the start of ``raw``."""
    head = raw[0] if raw else -1
    if 0x90 <= head <= 0x9F:
        return head - 0x90, 1
    if head == 0xDC:
        return int.from_bytes(raw[1:3], "big"), 3
    if head == 0xDD:
        return int.from_bytes(raw[1:5], "big"), 5
    raise InvalidObject("not an array")


def link_slice(raw: bytes | msgspec.Raw, offset: int, limit: int) -> tuple[list[ObjectId], int]:
    """Links ``offset:offset+limit`` of a msgpack array of links (a `View`'s ``Raw`` field),
    and how many it holds; only the page's items are read and checked to be links."""
    data = memoryview(raw)
    n, start = _array_head(bytes(data[:5]))
    if len(data) != start + n * _ITEM:
        raise InvalidObject("not an array of links")
    out = []
    for i in range(offset, min(n, offset + limit)):
        item = bytes(data[start + i * _ITEM : start + (i + 1) * _ITEM])
        if item[: len(LINK_MARK)] != LINK_MARK:
            raise InvalidObject(f"item {i} is not a link")
        out.append(ObjectId(item[len(LINK_MARK) :]))
    return out, n


def run_page(
    store: Store, head: JobHead, offset: int, limit: int
) -> tuple[list[tuple[ObjectId, RunRecord]], int]:
    """The runs ``offset:offset+limit`` of a job, decoded, and how many it has."""
    ids, total = link_slice(head.runs, offset, limit)
    return list(store.get_many(ids, RunRecord)), total


class _Patient(encoding.View):
    __kind__ = AtomTask.__kind__
    __version__ = AtomTask.__version__

    patient: str


def patients(store: Store, atoms: Iterable[ObjectId]) -> dict[ObjectId, str]:
    """atom id -> patient for the atoms that are atom tasks (others are left out)."""
    out = {}
    for oid, data in store.get_raw_many(list(dict.fromkeys(atoms)), allow_missing=True):
        if data is None:
            continue
        try:
            out[oid] = encoding.decode_view(data, _Patient).patient
        except InvalidObject:
            continue
    return out


class _BuildAtoms(encoding.View):
    __kind__ = BuildResult.__kind__
    __version__ = BuildResult.__version__

    atoms: msgspec.Raw


def build_atom_count(store: Store, build_result: ObjectId) -> int | None:
    """How many atom tasks a `BuildResult` holds, without decoding them (None: unreadable)."""
    try:
        view = encoding.decode_view(store.get_raw(build_result), _BuildAtoms)
        return _array_head(bytes(memoryview(view.atoms)[:5]))[0]
    except (InvalidObject, NotFound):
        return None


# -- blobs --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preview:
    """The start of a blob: its bytes (at most `PREVIEW_BYTES`) and its whole size."""

    data: bytes
    size: int

    @property
    def truncated(self) -> bool:
        return len(self.data) < self.size

    @property
    def text(self) -> str | None:
        """The bytes as UTF-8 text, or None when they are not text."""
        data = self.data
        if b"\0" in data:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.truncated and e.start >= len(data) - 3:  # cut in a character
                return data[: e.start].decode("utf-8", errors="replace")
            return None


def preview(store: Store, oid: ObjectId, limit: int = PREVIEW_BYTES) -> Preview:
    """The first ``limit`` bytes of a blob or chunked blob, read with bounded memory."""
    with store.open_blob(oid) as f:
        data = f.read(limit)
        size = f.seek(0, 2)
    return Preview(data, size)


# -- what only --show-answer-keys shows ---------------------------------------------------------
class Hidden:
    """Finds the objects that hold answers: answer keys (by kind) and the truth columns of
    every arm's answer columns (their blobs, and the chunks of a chunked one), found from
    the ``scores/answers/`` and ``results/`` refs. What was found is kept while those refs
    stay as they are, and found again when a score moves them (the viewer runs beside
    `bench score`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._blobs: set[ObjectId] = set()
        self._seen: tuple[tuple[str, ObjectId], ...] | None = None

    def reason(self, oid: ObjectId, kind: str) -> str | None:
        """Why ``oid`` (of ``kind``) is not shown, or None when it may be."""
        if kind == AnswerKey.__kind__:
            return "an answer key"
        if kind in ANSWER_KINDS:
            return "the secret salts of an answer commitment"
        if kind in (BLOB, CHUNKED) and oid in self.blobs():
            return "an answer column (derived from the answer keys)"
        return None

    def blobs(self) -> set[ObjectId]:
        refs = (*self.store.refs.items(ANSWER_REFS), *self.store.refs.items(RESULT_REFS))
        if refs != self._seen:
            self._blobs, self._seen = self._truth_blobs(refs), refs
        return self._blobs

    def _truth_blobs(self, refs: Iterable[tuple[str, ObjectId]]) -> set[ObjectId]:
        store = self.store
        columns = set()
        for name, oid in refs:
            if name.startswith(ANSWER_REFS):
                columns.add(oid)
                continue
            try:
                columns.update(store.get(oid, Result).answer_columns)
            except (InvalidObject, NotFound):
                continue
        blobs: set[ObjectId] = set()
        for _, record in _readable(store, columns, AnswerColumns):
            blobs.update(record.columns[c] for c in TRUTH_COLUMNS if c in record.columns)
        for _, data in store.get_raw_many(list(blobs), allow_missing=True):
            if data is not None and encoding.kind_of(data)[0] == CHUNKED:
                blobs.update(encoding.decode_body(data, ChunkedBlob).chunks)
        return blobs


def _readable[T](store: Store, ids: Iterable[ObjectId], cls: type[T]) -> list[tuple[ObjectId, T]]:
    out = []
    for oid, data in store.get_raw_many(list(ids), allow_missing=True):
        if data is None:
            continue
        try:
            out.append((oid, encoding.decode_body(data, cls)))
        except InvalidObject:
            continue
    return out
