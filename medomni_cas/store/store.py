"""`Store`: objects, links and refs on top of any `Backend`.

Every read is verified: the bytes are re-hashed and must match the id they were asked for.
Writes are put-if-absent; the only copy ever written over is a corrupt one, by a put of the
bytes that hash to its id (see `Backend.put_many`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import compress
from typing import Any, BinaryIO, Literal, TypeVar, cast, overload

import blake3

from medomni_cas.errors import (
    AmbiguousId,
    IntegrityError,
    InvalidId,
    InvalidName,
    InvalidObject,
    NotFound,
)
from medomni_cas.store import _order, encoding
from medomni_cas.store._crash import crash_point
from medomni_cas.store._fast import BatchReader, mismatches, unseen
from medomni_cas.store.backend import Backend
from medomni_cas.store.blobs import BlobReader, put_blob
from medomni_cas.store.encoding import BLOB, TREE, Record
from medomni_cas.store.ids import (
    MIN_PREFIX,
    ObjectId,
    check_prefix,
    hash_bytes,
    id_from_digest,
    parse_id,
)
from medomni_cas.store.objects import Tree, UnknownObject
from medomni_cas.store.refs import Refs, check_ref_name

__all__ = ["Progress", "Store"]

R = TypeVar("R", bound=Record)
Progress = Callable[[int], object]  # what it returns is ignored
_BATCH = 1024
# An LMDB commit costs the pages it dirties, so one large write batch is far cheaper per
# record than many small ones; bounded in bytes too, so large records keep memory bounded.
_PUT_ITEMS = 16_384
_PUT_BYTES = 16 << 20


def _as_id(value: ObjectId | str | bytes) -> ObjectId:
    return parse_id(value)


class Store:
    """A content-addressed object store with refs.

    Open one with `medomni_cas.open`. Objects go in with `put` (records), `put_blob`,
    `put_tree` or `put_raw` (canonical bytes from elsewhere), and come out verified.
    """

    def __init__(self, backend: Backend, *, single_writer: bool = False) -> None:
        self.backend = backend
        self.refs = Refs(self, single_writer=single_writer)

    @property
    def url(self) -> str:
        return self.backend.url

    def close(self) -> None:
        """Release the backend; the store is unusable afterwards (closing twice is harmless).

        A local environment that other stores of this process opened on the same path
        stays open until the last of them closes (``with mc.open(url) as store:``)."""
        self.backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- writing -------------------------------------------------------------------------------
    def put(self, record: Record) -> ObjectId:
        """Store a record; return its id."""
        return self._put_encoded(encoding.encode(record))

    def _put_encoded(self, data: bytes) -> ObjectId:
        oid = hash_bytes(data)
        self._check_links([(oid, data)])
        self.backend.put_many(((oid, data),))
        return oid

    def _check_links(self, batch: Sequence[tuple[ObjectId, bytes]]) -> None:
        """Refuse a batch with an object that links one neither stored nor in the batch:
        an object is present only when all it links is (so fsck, sync and gc never meet a
        parent whose child was never written). One presence check a batch."""
        datas = [data for _, data in batch]
        if not any(encoding.LINK_MARK in d for d in datas):
            return
        # the batched link reader (a few C-level passes a kind), as walks read links
        found, _, _ = BatchReader().links(datas, owners=False)
        wanted = set(found).difference(oid for oid, _ in batch)
        if not wanted:
            return
        absent = self.backend.missing(list(wanted))
        if absent:
            gone = ObjectId(absent[0])
            parent = next(oid for oid, data in batch if gone in encoding.links(data))
            raise NotFound(
                "object",
                f"{gone} (linked by {parent}, which is not stored: write what an object "
                "links before it)",
            )

    def put_many(
        self, records: Iterable[Record], *, progress: Progress | None = None
    ) -> list[ObjectId]:
        """Store records in batches; return their ids in order."""
        out: list[ObjectId] = []
        batch: list[tuple[ObjectId, bytes]] = []
        nbytes = 0
        enc, hasher = encoding.encode, blake3.blake3
        for record in records:
            data = enc(record)
            batch.append((id_from_digest(hasher(data).digest()), data))
            nbytes += len(data)
            if len(batch) >= _PUT_ITEMS or nbytes >= _PUT_BYTES:
                self._check_links(batch)
                self.backend.put_many(batch)
                out.extend(k for k, _ in batch)
                batch = []
                nbytes = 0
                if progress:
                    progress(len(out))
        if batch:
            self._check_links(batch)
            self.backend.put_many(batch)
            out.extend(k for k, _ in batch)
            if progress:
                progress(len(out))
        return out

    def put_object(self, kind: str, version: int, body: Any) -> ObjectId:
        """Store an object of any kind from its parts (no registered class needed)."""
        if kind == BLOB:
            raise InvalidObject("use put_blob for blobs")
        if encoding.too_deep(body, encoding.MAX_DEPTH - 1):  # the envelope is a level
            raise InvalidObject(
                f"{kind} object nests maps and arrays deeper than {encoding.MAX_DEPTH} levels"
            )
        return self._put_encoded(encoding.encode_object(kind, version, body))

    def put_raw(self, data: bytes, *, expected: ObjectId | None = None) -> ObjectId:
        """Store canonical bytes made elsewhere (a bundle, a remote), after checking them."""
        return self.put_raw_many([(expected, data)])[0]

    def put_raw_many(self, items: Iterable[tuple[ObjectId | None, bytes]]) -> list[ObjectId]:
        """Check and store ``(expected id or None, canonical bytes)`` pairs, all or nothing.

        Every item is validated before any is written: a bad one raises `IntegrityError`
        (wrong id) or `InvalidObject` (not canonical) and nothing from the call is stored.
        Items that link each other are written children first, whatever their order here
        (`_order.levels`), so a writer killed part way leaves no object without its links;
        or all in one write where the backend makes them visible together (a pack).
        """
        checked: list[tuple[ObjectId, bytes]] = []
        linking: list[int] = []  # the items that may link others (not blobs)
        for expected, data in items:
            oid = hash_bytes(data)
            if expected is not None and oid != expected:
                raise IntegrityError(str(ObjectId(expected)), str(oid))
            try:
                kind, _ = encoding.validate_canonical(data)
            except InvalidObject as e:
                raise InvalidObject(f"object {oid}: {e}") from None
            if kind != BLOB:
                linking.append(len(checked))
            checked.append((oid, bytes(data)))
        order: list[list[int]] = [list(range(len(checked)))]
        together = len(checked) <= _BATCH and self.backend.visible_together(
            [len(d) for _, d in checked]
        )
        if linking and len(checked) > 1 and not together:
            node = {oid: i for i, (oid, _) in enumerate(checked)}
            kids: list[list[int]] = [[] for _ in checked]
            for i in linking:
                kids[i] = [node[x] for x in encoding.links(checked[i][1]) if x in node]
            order = _order.levels(kids)
        for level in order:
            for i in range(0, len(level), _BATCH):
                self.backend.put_many([checked[j] for j in level[i : i + _BATCH]])
                crash_point("write")
        return [oid for oid, _ in checked]

    def put_blob(
        self, source: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
    ) -> ObjectId:
        """Store bytes, a file (by path) or a binary stream; large ones are chunked."""
        return put_blob(self, source)

    def put_tree(self, entries: Mapping[str, ObjectId] | Tree) -> ObjectId:
        """Store a folder: entry name -> id. Names are validated; every entry must exist."""
        tree = entries if isinstance(entries, Tree) else Tree(entries)
        absent = self.backend.missing(list(tree.values()))
        if absent:
            name = next(n for n, v in tree.items() if v == absent[0])
            raise NotFound("object", f"{ObjectId(absent[0])} (tree entry {name!r})")
        return self._put_encoded(encoding.encode_object(TREE, 1, dict(tree.items())))

    def put_trees(self, trees: Iterable[Mapping[str, ObjectId] | Tree]) -> list[ObjectId]:
        """Store many folders in one batch (one presence check for all their entries)."""
        built = [t if isinstance(t, Tree) else Tree(t) for t in trees]
        wanted = list({v for t in built for v in t.values()})
        absent = set(self.backend.missing(wanted))
        if absent:
            for t in built:
                for name, v in t.items():
                    if v in absent:
                        raise NotFound("object", f"{ObjectId(v)} (tree entry {name!r})")
        items = []
        for t in built:
            data = encoding.encode_object(TREE, 1, dict(t.items()))
            items.append((hash_bytes(data), data))
        for i in range(0, len(items), _BATCH):
            self.backend.put_many(items[i : i + _BATCH])
        return [oid for oid, _ in items]

    # -- reading -------------------------------------------------------------------------------
    def get_raw(self, oid: ObjectId | str) -> bytes:
        """The canonical bytes of an object, verified against its id."""
        oid = _as_id(oid)
        try:
            data = self.backend.get(oid)
        except KeyError:
            raise NotFound("object", oid.hex()) from None
        got = blake3.blake3(data).digest()
        if got != oid:
            raise IntegrityError(oid.hex(), got.hex(), self.url)
        return data

    @overload
    def get_raw_many(
        self, oids: Iterable[ObjectId], *, allow_missing: Literal[False] = ...
    ) -> Iterator[tuple[ObjectId, bytes]]: ...
    @overload
    def get_raw_many(
        self, oids: Iterable[ObjectId], *, allow_missing: bool
    ) -> Iterator[tuple[ObjectId, bytes | None]]: ...
    def get_raw_many(
        self, oids: Iterable[ObjectId], *, allow_missing: bool = False
    ) -> Iterator[tuple[ObjectId, bytes | None]]:
        """``(id, verified bytes)`` for each id, batched; missing ones raise `NotFound`
        unless ``allow_missing`` (then their bytes are None)."""
        oids = list(oids)
        for i in range(0, len(oids), _BATCH):
            for key, data in self.backend.get_many(oids[i : i + _BATCH]):
                if data is None:
                    if not allow_missing:
                        raise NotFound("object", ObjectId(key).hex())
                    yield ObjectId(key), None
                    continue
                got = blake3.blake3(data).digest()
                if got != key:
                    raise IntegrityError(bytes(key).hex(), got.hex(), self.url)
                yield (key if type(key) is ObjectId else id_from_digest(key)), data

    @overload
    def get(self, oid: ObjectId | str, cls: type[R]) -> R: ...
    @overload
    def get(self, oid: ObjectId | str, cls: None = None) -> Any: ...

    def get(self, oid: ObjectId | str, cls: type[Any] | None = None) -> Any:
        """An object decoded: a record of its registered class, a `Tree`, the bytes of a
        small blob, or an `UnknownObject`. With ``cls``, the kind must match it."""
        return self._decode(_as_id(oid), self.get_raw(oid), cls)

    def get_many(
        self, oids: Iterable[ObjectId], cls: type[Any] | None = None
    ) -> Iterator[tuple[ObjectId, Any]]:
        for oid, data in self.get_raw_many(oids):
            yield oid, self._decode(oid, data, cls)

    def _decode(self, oid: ObjectId, data: bytes, cls: type[Any] | None) -> Any:
        try:
            if cls is not None and issubclass(cls, Record):
                return encoding.decode_body(data, cls)
            kind, version, body = encoding.decode(data)
        except InvalidObject as e:
            raise InvalidObject(f"object {oid}: {e}") from None
        if kind == TREE:
            try:
                obj: Any = Tree(body)
            except InvalidName as e:
                raise InvalidName(f"object {oid}: {e}") from None
            except (TypeError, ValueError) as e:
                raise InvalidObject(f"object {oid}: malformed tree: {e}") from None
        elif isinstance(body, Record) or kind == BLOB:
            obj = body
        else:
            obj = UnknownObject(kind, version, body)
        if cls is not None and not isinstance(obj, cls):
            raise InvalidObject(f"object {oid} is a {kind}, not a {cls.__name__}")
        return obj

    def kind(self, oid: ObjectId | str) -> str:
        return encoding.kind_of(self.get_raw(oid))[0]

    def open_blob(self, oid: ObjectId | str) -> BlobReader:
        """A seekable binary file over a blob (chunked or not), with bounded memory."""
        return BlobReader(self, _as_id(oid))

    def read_blob(self, oid: ObjectId | str) -> bytes:
        with self.open_blob(oid) as f:
            return f.readall()

    def has(self, oid: ObjectId | str) -> bool:
        return self.backend.contains(_as_id(oid))

    def __contains__(self, oid: object) -> bool:
        try:
            return isinstance(oid, str | bytes) and self.backend.contains(_as_id(oid))
        except InvalidId:
            return False

    def missing(self, oids: Iterable[ObjectId | str]) -> list[ObjectId]:
        """The ids that are not stored, in order (one batched check)."""
        return [ObjectId(k) for k in self.backend.missing([_as_id(o) for o in oids])]

    # -- names -----------------------------------------------------------------------------------
    def resolve(self, spec: str | ObjectId) -> ObjectId:
        """An id from a full id, a unique prefix of at least 8 hex characters, or a ref name."""
        if isinstance(spec, ObjectId):
            return spec
        text = spec.strip()
        is_hex = bool(text) and all(c in "0123456789abcdefABCDEF" for c in text)
        if is_hex and len(text) >= MIN_PREFIX:
            prefix = check_prefix(text)
            matches = list(self.backend.iter_keys(prefix))
            if len(matches) == 1:
                return ObjectId(matches[0])
            if len(matches) > 1:
                raise AmbiguousId(prefix, sorted(m.hex() for m in matches))
        try:
            check_ref_name(text)
        except InvalidName:
            raise InvalidId(f"not an object id, id prefix or ref name: {spec!r}") from None
        target = self.refs.get(text)
        if target is not None:
            return target
        if is_hex and len(text) < MIN_PREFIX:
            raise InvalidId(
                f"id prefix {text!r} is too short: give at least {MIN_PREFIX} characters"
            )
        raise NotFound("object or ref", text)

    # -- graph -----------------------------------------------------------------------------------
    def walk(
        self,
        roots: Iterable[ObjectId | str],
        *,
        allow_missing: bool = False,
        progress: Progress | None = None,
    ) -> Iterator[tuple[ObjectId, bytes | None]]:
        """Every object reachable from ``roots`` once, breadth first, verified, in batches.

        A missing object raises `NotFound` naming it, unless ``allow_missing`` (then it is
        yielded with None). A corrupt one raises `IntegrityError`.
        """
        seen: set[bytes] = set()
        frontier: list[bytes] = []
        for r in roots:
            oid = _as_id(r)
            if oid not in seen:
                seen.add(oid)
                frontier.append(oid)
        count = 0
        reader = BatchReader()
        while frontier:
            nxt: list[bytes] = []
            for i in range(0, len(frontier), _BATCH):
                links: list[bytes] = []
                batch = frontier[i : i + _BATCH]
                for oid, data in self._walk_batch(batch, allow_missing, links, reader):
                    count += 1
                    yield oid, data
                nxt += unseen(seen, links)
            if progress:
                progress(count)
            frontier = nxt

    def _walk_batch(
        self, keys: list[bytes], allow_missing: bool, links: list[bytes], reader: BatchReader
    ) -> Iterator[tuple[ObjectId, bytes | None]]:
        """``(id, verified bytes or None)`` of each key, in order; then the links of the batch
        are put in ``links`` (each object's in the order of its bytes). The batch is read,
        hashed and its links found in a few C-level passes (``reader``), and each problem is
        raised when its object's turn comes, as reading one object at a time would."""
        got = self.backend.get_list(keys)
        present = [data is not None for data in got]  # not truthiness: b"" is an object
        datas = cast("list[bytes]", list(compress(got, present)))  # the None left out
        corrupt = set(mismatches(list(compress(keys, present)), datas))
        found, _, errors = reader.links(datas, ordered=True)
        j = 0
        for key, here in zip(keys, present, strict=True):
            oid = key if type(key) is ObjectId else id_from_digest(key)
            if not here:
                if not allow_missing:
                    raise NotFound("object", oid.hex())
                yield oid, None
                continue
            data = datas[j]
            if j in corrupt:
                raise IntegrityError(oid.hex(), blake3.blake3(data).hexdigest(), self.url)
            if j in errors:
                try:
                    encoding.links(data)  # raises its own error for what is wrong
                except InvalidObject as e:
                    raise InvalidObject(f"object {oid}: {e}") from None
                raise InvalidObject(f"object {oid}: {errors[j]}")
            yield oid, data
            j += 1
        links += found

    def closure(
        self, roots: Iterable[ObjectId | str] | ObjectId | str, *, allow_missing: bool = False
    ) -> set[ObjectId]:
        """The ids of every object reachable from ``roots`` (the roots included)."""
        if isinstance(roots, (str, ObjectId)):
            roots = [roots]
        return {
            oid for oid, data in self.walk(roots, allow_missing=allow_missing) if data is not None
        }

    def iter_ids(self, prefix: str = "") -> Iterator[ObjectId]:
        return (ObjectId(k) for k in self.backend.iter_keys(prefix))
