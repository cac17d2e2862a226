"""A zarr v3 store over the CAS: chunks are content-addressed blobs, a commit is a tree id.

Layout
------
Keys map to nested trees, one tree per ``/``-separated segment: ``a/b/c/0.0`` is the blob
``0.0`` in tree ``c`` of tree ``b`` of tree ``a``. A key that is both a value and a folder
(``a`` and ``a/b``, which zarr's own hierarchies never make but a key-value store must allow)
keeps the value of ``a`` in the entry `VALUE_ENTRY` of tree ``a``; that segment is therefore
reserved in keys. Zarr node names may not start with ``__``, so no zarr hierarchy uses it.

Writes and commits
------------------
Every value is put as a blob when it is set, so identical chunks are stored once and memory
stays bounded: the store keeps only key -> blob id for uncommitted writes (and the
deletions). `CASStore.commit` builds the changed trees bottom-up and returns the root tree
id; nothing under an unchanged folder is read or rewritten, and the same keys and values
always give the same id.

Reads
-----
Trees and values are read through the store's one tree reader,
`medomni_cas.store.trees.NodeCache`, which checks every tree and chunked-blob manifest;
reads are verified against their ids.

Example
-------
>>> import medomni_cas as mc, zarr
>>> cas = mc.open("memory://")
>>> store = CASStore(cas)
>>> arr = zarr.create_array(store, shape=(4,), dtype="i4", chunks=(2,))
>>> arr[:] = [1, 2, 3, 4]
>>> root = store.commit(ref="arrays/example")
>>> zarr.open_array(CASStore(cas, "arrays/example", read_only=True))[:].tolist()
[1, 2, 3, 4]
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Self

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    SuffixByteRequest,
)
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from medomni_cas.errors import ConflictError, InvalidName, InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNK_SIZE, check_entry_name
from medomni_cas.store.refs import check_ref_name
from medomni_cas.store.store import Store
from medomni_cas.store.trees import Node, NodeCache

__all__ = ["VALUE_ENTRY", "CASStore", "put_zarr_directory"]

#: The tree entry that holds the value of a key which is also a folder (``a`` beside ``a/b``).
VALUE_ENTRY = "__value__"

# Nodes (kinds, sizes and tree entries) a session remembers, least recently used first out;
# an id's node never changes, so this is only a bound on memory.
_MAX_NODES = 1 << 16
# Entries read per step while listing, so that a listing stops reading once it has an answer.
_LIST_STEP = 16


def _segments(key: str) -> list[str]:
    """The tree entry names of ``key``, or `InvalidName` (a ValueError) naming the key."""
    if not isinstance(key, str):
        raise TypeError(f"a zarr key must be a str, not {type(key).__name__}")
    parts = key.split("/")
    for part in parts:
        try:
            check_entry_name(part)
            part.encode("utf-8")
        except InvalidName as e:
            raise InvalidName(f"invalid zarr key {key!r}: {e}") from None
        except UnicodeEncodeError:
            raise InvalidName(f"invalid zarr key {key!r}: not valid UTF-8") from None
        if part == VALUE_ENTRY:
            raise InvalidName(
                f"invalid zarr key {key!r}: the segment {VALUE_ENTRY!r} is reserved "
                "(it holds the value of a key that is also a folder)"
            )
    return parts


def _covered(key: str, dropped: frozenset[str] | set[str]) -> bool:
    """Whether a folder prefix in ``dropped`` (each ends with ``/``) hides ``key``."""
    if not dropped:
        return False
    start = 0
    while (i := key.find("/", start)) >= 0:
        if key[: i + 1] in dropped:
            return True
        start = i + 1
    return False


def _span(size: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """``(start, stop)`` of a byte request on a value of ``size`` bytes, clamped like a slice."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start, stop = byte_range.offset, size
    elif isinstance(byte_range, SuffixByteRequest):
        if byte_range.suffix < 0:
            raise ValueError(f"negative byte range: {byte_range}")
        start, stop = max(0, size - byte_range.suffix), size
    else:
        raise TypeError(f"Unexpected byte_range, got {byte_range}.")
    if start < 0 or stop < 0:
        raise ValueError(f"negative byte range: {byte_range}")
    start = min(start, size)
    return start, min(max(stop, start), size)


class _Folder:
    """A tree being rebuilt by a commit: entry name -> an unchanged id or a rebuilt folder."""

    __slots__ = ("entries",)

    def __init__(self, entries: dict[str, ObjectId | _Folder] | None = None) -> None:
        self.entries: dict[str, ObjectId | _Folder] = entries or {}


class _Session:
    """The working state of a store: the committed root it reads through, plus uncommitted
    writes as key -> blob id (None: deleted) and dropped folder prefixes. Views made by
    `CASStore.with_read_only` share one, as zarr expects of "the same location"."""

    def __init__(
        self, store: Store, root: ObjectId | None, seen: dict[str, ObjectId | None]
    ) -> None:
        self.store = store
        self.nodes = NodeCache(store, _MAX_NODES)
        self.root = root  # the tree opened or last committed
        self.base = root  # the tree reads fall through to (None after a clear)
        self.pending: dict[str, ObjectId | None] = {}
        self.dropped: set[str] = set()  # folder prefixes ending in "/" whose base keys are gone
        self.seen = dict(seen)  # ref name -> the value this session built on
        self.lock = threading.RLock()

    def state(self) -> tuple[Any, ...]:
        with self.lock:
            return self.base, dict(self.pending), frozenset(self.dropped)

    # -- writing -------------------------------------------------------------------------------
    def put(self, key: str, oid: ObjectId | None) -> None:
        with self.lock:
            self.pending[key] = oid

    def drop(self, prefix: str) -> None:
        """Forget every key that starts with ``prefix`` ("" or ending with "/")."""
        with self.lock:
            if not prefix:
                self.base = None
                self.pending.clear()
                self.dropped.clear()
                return
            for key in [k for k in self.pending if k.startswith(prefix)]:
                del self.pending[key]
            self.dropped = {d for d in self.dropped if not d.startswith(prefix)}
            self.dropped.add(prefix)

    # -- reading -------------------------------------------------------------------------------
    def locate(self, key: str) -> tuple[Node | None, bytes | None]:
        """The node of the value of ``key`` (None: absent), and its bytes if they were read
        just now (a small blob's value is then read once)."""
        segments = _segments(key)
        with self.lock:
            pending = key in self.pending
            oid = self.pending[key] if pending else self.base
            if oid is None or (not pending and _covered(key, self.dropped)):
                return None, None
        if pending:
            return self.nodes.read(oid, key)
        node, data = self.nodes.read(oid)
        for i, name in enumerate(segments):
            child = node.entries.get(name) if node.entries is not None else None
            if child is None:
                return None, None
            node, data = self.nodes.read(child, "/".join(segments[: i + 1]))
        if node.entries is None:
            return node, data
        value = node.entries.get(VALUE_ENTRY)
        if value is None:
            return None, None
        found, data = self.nodes.read(value, f"{key}/{VALUE_ENTRY}")
        if found.entries is not None:
            raise InvalidObject(f"tree {node.id} at {key!r}: its {VALUE_ENTRY!r} entry is a tree")
        return found, data

    def _snapshot(
        self,
    ) -> tuple[ObjectId | None, dict[str, ObjectId | None], frozenset[str], Callable[[str], bool]]:
        with self.lock:
            base, pending, dropped = self.base, dict(self.pending), frozenset(self.dropped)

        def hidden(key: str) -> bool:
            return key in pending or _covered(key, dropped)

        return base, pending, dropped, hidden

    def _steps(self, items: list[tuple[str, ObjectId]]) -> Iterator[tuple[str, Node]]:
        """The node of each ``(key, id)``, read in small batches as they are consumed."""
        for i in range(0, len(items), _LIST_STEP):
            step = items[i : i + _LIST_STEP]
            nodes = self.nodes.nodes((oid, key) for key, oid in step)
            for key, oid in step:
                yield key, nodes[oid]

    def _walk(
        self,
        folder: str,
        tree: ObjectId,
        prefix: str,
        hidden: Callable[[str], bool],
        dropped: frozenset[str],
    ) -> Iterator[str]:
        """Visible keys starting with ``prefix`` under ``tree``, the folder at ``folder``.
        Only subtrees that can hold such keys are read."""
        stack = [(folder, tree)]
        while stack:
            here, tid = stack.pop()
            entries = self.nodes.entries(tid, here) or {}
            lead = f"{here}/" if here else ""
            todo = [
                (lead + name, oid)
                for name, oid in sorted(entries.items())
                if name != VALUE_ENTRY
                and ((lead + name).startswith(prefix) or prefix.startswith(f"{lead}{name}/"))
            ]
            for key, node in self._steps(todo):
                sub = node.entries
                if sub is None:
                    if key.startswith(prefix) and not hidden(key):
                        yield key
                    continue
                if VALUE_ENTRY in sub and key.startswith(prefix) and not hidden(key):
                    yield key
                if not _covered(key + "/", dropped):
                    stack.append((key, node.id))

    def keys(self, prefix: str) -> Iterator[str]:
        """Every key that starts with ``prefix``: uncommitted ones, then the base tree's."""
        base, pending, dropped, hidden = self._snapshot()
        for key, oid in pending.items():
            if oid is not None and key.startswith(prefix):
                yield key
        if base is not None:
            yield from self._walk("", base, prefix, hidden, dropped)

    def children(self, prefix: str) -> Iterator[str]:
        """The first segments of the keys under folder ``prefix``, each once."""
        base, pending, dropped, hidden = self._snapshot()
        here = prefix.rstrip("/")
        lead = f"{here}/" if here else ""
        names: set[str] = set()
        for key, oid in pending.items():
            if oid is not None and key.startswith(lead):
                name = key[len(lead) :].split("/", 1)[0]
                if name not in names:
                    names.add(name)
                    yield name
        folder = self._tree_at(base, here)
        if folder is None:
            return
        todo = [
            (lead + name, oid)
            for name, oid in sorted((folder.entries or {}).items())
            if name != VALUE_ENTRY and name not in names
        ]
        for key, node in self._steps(todo):
            sub = node.entries
            if sub is None:
                visible = not hidden(key)
            else:
                visible = (VALUE_ENTRY in sub and not hidden(key)) or (
                    not _covered(key + "/", dropped)
                    and next(self._walk(key, node.id, key + "/", hidden, dropped), None) is not None
                )
            if visible:
                yield key[len(lead) :]

    def _tree_at(self, base: ObjectId | None, path: str) -> Node | None:
        """The tree at folder ``path`` of ``base``, or None."""
        if base is None:
            return None
        try:
            segments = _segments(path) if path else []
        except InvalidName:
            return None  # no key can live under an invalid folder name
        node = self.nodes.node(base)
        for i, name in enumerate(segments):
            child = node.entries.get(name) if node.entries is not None else None
            if child is None:
                return None
            node = self.nodes.node(child, "/".join(segments[: i + 1]))
        return node if node.entries is not None else None

    # -- committing ----------------------------------------------------------------------------
    def build(self) -> ObjectId:
        """Store the trees of the current state, bottom-up; return the root tree id."""
        with self.lock:
            base, pending, dropped = self.base, dict(self.pending), sorted(self.dropped)
        root = _Folder(dict(self.nodes.entries(base) or {}) if base is not None else {})
        for prefix in dropped:  # before the writes: every pending write is newer than a drop
            self._apply(root, prefix[:-1].split("/"), None, drop=True)
        for key, oid in pending.items():
            self._apply(root, key.split("/"), oid, drop=False)
        entries = {}
        for name, entry in root.entries.items():
            oid = self._store_folder(entry) if isinstance(entry, _Folder) else entry
            if oid is not None:
                entries[name] = oid
        return self._put_tree(entries)

    def _put_tree(self, entries: dict[str, ObjectId]) -> ObjectId:
        """Store a tree and keep its node, so that reads after a commit do not read it back."""
        tid = self.store.put_tree(entries)
        self.nodes.add(Node(tid, TREE, len(entries), entries))
        return tid

    def _open(self, parent: _Folder, name: str, *, create: bool) -> _Folder | None:
        """Entry ``name`` of ``parent`` as a folder to change; a value there moves into it."""
        entry = parent.entries.get(name)
        if isinstance(entry, _Folder):
            return entry
        if entry is None:
            if not create:
                return None
            folder = _Folder()
        else:
            entries = self.nodes.entries(entry)
            if entries is None:
                if not create:
                    return None
                folder = _Folder({VALUE_ENTRY: entry})
            else:
                folder = _Folder(dict(entries))
        parent.entries[name] = folder
        return folder

    def _apply(self, root: _Folder, path: list[str], oid: ObjectId | None, *, drop: bool) -> None:
        """Set (``oid``), delete (None) or, with ``drop``, empty the folder at ``path``."""
        create = oid is not None
        parent = root
        for name in path[:-1]:
            opened = self._open(parent, name, create=create)
            if opened is None:
                return
            parent = opened
        last = path[-1]
        entry = parent.entries.get(last)
        is_folder = isinstance(entry, _Folder) or (
            entry is not None and self.nodes.entries(entry) is not None
        )
        if drop:
            if is_folder:
                folder = self._open(parent, last, create=False)
                assert folder is not None
                value = folder.entries.get(VALUE_ENTRY)
                if value is None:
                    del parent.entries[last]
                else:  # the key naming the folder is not under the prefix: keep it
                    parent.entries[last] = value
        elif is_folder:
            folder = self._open(parent, last, create=False)
            assert folder is not None
            if oid is None:
                folder.entries.pop(VALUE_ENTRY, None)
            else:
                folder.entries[VALUE_ENTRY] = oid
        elif oid is None:
            parent.entries.pop(last, None)
        else:
            parent.entries[last] = oid

    def _store_folder(self, folder: _Folder) -> ObjectId | None:
        """Store a rebuilt folder: None if it ended up empty, its value if that is all."""
        entries: dict[str, ObjectId] = {}
        for name, entry in folder.entries.items():
            oid = self._store_folder(entry) if isinstance(entry, _Folder) else entry
            if oid is not None:
                entries[name] = oid
        if not entries:
            return None
        if entries.keys() == {VALUE_ENTRY}:
            return entries[VALUE_ENTRY]
        return self._put_tree(entries)


# Pickling: a store travels as its URL, and within one process as the very same `Store`
# object (a memory:// store has nothing but that object).
_TOKENS: weakref.WeakKeyDictionary[Store, str] = weakref.WeakKeyDictionary()
_STORES: weakref.WeakValueDictionary[str, Store] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


def _token(store: Store) -> str:
    with _REGISTRY_LOCK:
        token = _TOKENS.get(store)
        if token is None:
            token = _TOKENS[store] = uuid.uuid4().hex
            _STORES[token] = store
        return token


def _find_store(token: str, url: str) -> Store:
    store = _STORES.get(token)
    if store is not None:
        return store
    if url.startswith("memory:"):
        raise ValueError(
            "a CASStore over a memory:// store cannot be unpickled in another process: "
            "its objects live only in the process that made them"
        )
    from medomni_cas.store.url import open_store

    return open_store(url)


def _same_storage(a: Store, b: Store) -> bool:
    return a is b or (a.url == b.url and not a.url.startswith("memory:"))


class CASStore(ZarrStore):
    """A zarr v3 store whose keys live in nested trees of a `medomni_cas` store.

    Parameters
    ----------
    store
        The CAS store that holds the blobs and trees. It is not closed with this store.
    root
        What to read from: a tree id, an id prefix of 8+ hex characters, or a ref whose
        value is a tree id. None starts empty.
    read_only
        Whether to refuse writes.

    Writes stay uncommitted until `commit`, which returns the root tree id (and can move a
    ref); views from `with_read_only` share them. Keys are ``/``-separated tree entry names;
    an invalid one raises `medomni_cas.InvalidName` (a ValueError) naming it.
    """

    supports_writes: bool = True
    supports_deletes: bool = True
    supports_listing: bool = True

    _session: _Session

    def __init__(
        self, store: Store, root: ObjectId | str | None = None, *, read_only: bool = False
    ) -> None:
        super().__init__(read_only=read_only)
        seen: dict[str, ObjectId | None] = {}
        tree: ObjectId | None = None
        if isinstance(root, ObjectId):
            tree = root
        elif root is not None:
            tree = store.resolve(root)
            name = root.strip()
            try:
                if store.refs.get(name) == tree:
                    seen[name] = tree
            except InvalidName:
                pass  # an id or id prefix, not a ref name
        session = _Session(store, tree, seen)
        if tree is not None and (kind := session.nodes.node(tree).kind) != TREE:
            raise InvalidObject(
                f"object {tree} is a {kind}, not a tree: it cannot root a zarr store"
            )
        self._session = session

    @classmethod
    def _view(cls, session: _Session, read_only: bool) -> Self:
        view = cls.__new__(cls)
        ZarrStore.__init__(view, read_only=read_only)
        view._session = session
        return view

    @property
    def cas(self) -> Store:
        """The CAS store underneath."""
        return self._session.store

    @property
    def root(self) -> ObjectId | None:
        """The tree this store was opened at or last committed (None: never had one)."""
        return self._session.root

    @property
    def has_changes(self) -> bool:
        """Whether there are writes or deletions not yet committed."""
        s = self._session
        with s.lock:
            return bool(s.pending or s.dropped) or s.base != s.root

    def commit(self, *, ref: str | None = None, message: str = "") -> ObjectId:
        """Store the trees of every key and return the root tree id; reads then go to it.

        With ``ref``, also move that ref to the new root by compare-and-swap against the
        value this store built on: the value it was opened at (when ``root`` named this
        ref) or last committed to it; for any other ref, it must not exist yet. If the ref
        moved meanwhile, `ConflictError` is raised and the uncommitted writes are kept.
        """
        self._check_writable()
        s = self._session
        if ref is not None:
            check_ref_name(ref)
        with s.lock:
            tid = s.build()
            if ref is not None:
                expected = s.seen.get(ref)
                text = message or f"zarr commit {tid.short}"
                if not s.store.refs.set_if_equals(ref, expected, tid, text):
                    current = s.store.refs.get(ref)
                    raise ConflictError(
                        ref,
                        None if expected is None else str(expected),
                        None if current is None else str(current),
                    )
                s.seen[ref] = tid
            s.root = s.base = tid
            s.pending.clear()
            s.dropped.clear()
        return tid

    # -- zarr.abc.store.Store ----------------------------------------------------------------------
    def with_read_only(self, read_only: bool = False) -> CASStore:
        # docstring inherited
        return self._view(self._session, read_only)

    def __eq__(self, other: object) -> bool:
        # docstring inherited; equal when they would read the same keys and values
        if not isinstance(other, CASStore):
            return False
        a, b = self._session, other._session
        return (
            self.read_only == other.read_only
            and _same_storage(a.store, b.store)
            and (a is b or a.state() == b.state())
        )

    __hash__ = None  # type: ignore[assignment]  # equal stores may differ later: mutable

    def __repr__(self) -> str:
        root = self._session.root
        shown = root.short if root is not None else None
        flag = ", read_only=True" if self.read_only else ""
        return f"CASStore({self._session.store.url!r}, root={shown!r}{flag})"

    def __getstate__(self) -> dict[str, Any]:
        s = self._session
        with s.lock:
            return {
                "url": s.store.url,
                "token": _token(s.store),
                "root": s.root,
                "base": s.base,
                "pending": dict(s.pending),
                "dropped": set(s.dropped),
                "seen": dict(s.seen),
                "read_only": self._read_only,
            }

    def __setstate__(self, state: dict[str, Any]) -> None:
        session = _Session(_find_store(state["token"], state["url"]), state["root"], state["seen"])
        session.base = state["base"]
        session.pending = dict(state["pending"])
        session.dropped = set(state["dropped"])
        ZarrStore.__init__(self, read_only=state["read_only"])
        self._session = session

    # sync surface (zarr.abc.store.SupportsSyncStore): the work is local and cheap, so the
    # async methods below call these directly
    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        """The value of ``key`` (or part of it), None if absent; reads are verified."""
        if byte_range is not None and not isinstance(
            byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)
        ):
            raise TypeError(f"Unexpected byte_range, got {byte_range}.")
        prototype = prototype or default_buffer_prototype()
        self._is_open = True
        s = self._session
        node, data = s.locate(key)
        if node is None:
            return None
        if node.kind == BLOB:
            value = encoding.blob_data(data if data is not None else s.store.get_raw(node.id))
            start, stop = _span(len(value), byte_range)
            return prototype.buffer.from_bytes(value[start:stop])
        # a chunked blob: read only the chunks the range covers
        with s.store.open_blob(node.id) as f:
            start, stop = _span(f.size, byte_range)
            f.seek(start)
            return prototype.buffer.from_bytes(f.read(stop - start))

    def set_sync(self, key: str, value: Buffer) -> None:
        """Put ``value`` as a blob now and remember it under ``key`` until `commit`."""
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(
                f"CASStore.set(): `value` must be a Buffer instance, not {type(value).__name__}"
            )
        _segments(key)
        self._is_open = True
        data = value.to_bytes()
        oid = self._session.store.put_blob(data)
        # put_blob chunks exactly the values longer than one chunk; a single blob's node is
        # known without reading it back (a chunked one's chunk ids are not)
        self._set_id(key, oid, Node(oid, BLOB, len(data)) if len(data) <= CHUNK_SIZE else None)

    def _set_id(self, key: str, oid: ObjectId, node: Node | None = None) -> None:
        _segments(key)
        if node is not None:
            self._session.nodes.add(node)
        self._session.put(key, oid)

    def delete_sync(self, key: str) -> None:
        """Forget ``key`` (absent keys are fine); its blob stays until gc finds it unused."""
        self._check_writable()
        _segments(key)
        self._is_open = True
        self._session.put(key, None)

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        # docstring inherited
        return self.get_sync(key, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        # docstring inherited
        return [self.get_sync(k, prototype=prototype, byte_range=r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        # docstring inherited
        return self._session.locate(key)[0] is not None

    async def getsize(self, key: str) -> int:
        # docstring inherited; the size is the node's (a chunked blob's from its manifest alone)
        node = self._session.locate(key)[0]
        if node is None:
            raise FileNotFoundError(key)
        return node.size

    async def set(self, key: str, value: Buffer) -> None:
        # docstring inherited
        self.set_sync(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        # docstring inherited; the lock makes the check and the write one step
        self._check_writable()
        s = self._session
        with s.lock:
            if s.locate(key)[0] is None:
                self.set_sync(key, value)

    async def delete(self, key: str) -> None:
        # docstring inherited
        self.delete_sync(key)

    async def delete_dir(self, prefix: str) -> None:
        # docstring inherited; recorded as one dropped prefix, not one deletion per key
        self._check_writable()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self._session.drop(prefix)

    async def list(self) -> AsyncIterator[str]:
        # docstring inherited
        for key in self._session.keys(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        for key in self._session.keys(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        for name in self._session.children(prefix):
            yield name


def put_zarr_directory(store: Store, path: str | os.PathLike[str]) -> ObjectId:
    """Import a zarr hierarchy from disk (e.g. written by ``zarr.storage.LocalStore``);
    return its root tree id.

    Every regular file becomes the key of its relative path, streamed in as a blob. The
    folder is checked first, so a symlink or special file (`InvalidObject`) or a name that
    cannot be a key (`InvalidName`) stores nothing. Empty folders are left out: a zarr
    store has no keys there.
    """
    top = os.fspath(path)
    if not os.path.isdir(top):
        raise NotADirectoryError(f"not a folder: {top!r}")
    files: list[tuple[str, str]] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(top, rel)) as it:
            for entry in sorted(it, key=lambda e: e.name):
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    raise InvalidObject(f"{entry.path!r} is a symlink; only files are imported")
                if entry.is_dir(follow_symlinks=False):
                    stack.append(key)
                elif entry.is_file(follow_symlinks=False):
                    _segments(key)
                    files.append((key, entry.path))
                else:
                    raise InvalidObject(f"{entry.path!r} is not a regular file or folder")
    target = CASStore(store)
    for key, file in files:
        target._set_id(key, store.put_blob(file))
    return target.commit()
