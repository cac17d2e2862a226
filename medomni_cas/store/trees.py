"""Trees: one checked node reader, folders in and out, listing, walking and diffing.

Reading
-------
Every tree object is read from its raw canonical bytes by `NodeCache`, which re-validates
each entry name rather than trusting `Tree` (whose constructor validates, but which is only
one way in): a tree that arrived in a bundle or from a remote may have been crafted to hold
``..``, ``/`` or NUL in a name, and must never make an export write outside its target. The
fsspec and zarr views read through the same cache, so all three agree on what an id holds.

Entry names
-----------
The rules live in `medomni_cas.store.objects` beside `Tree`; `check_entry_name` and
`MAX_ENTRY_NAME` are re-exported here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal

import msgspec

from medomni_cas.errors import InvalidName, InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ObjectId, parse_id
from medomni_cas.store.objects import (
    CHUNKED,
    MAX_ENTRY_NAME,
    ChunkedBlob,
    check_entry_name,
    check_tree_body,
)

if TYPE_CHECKING:
    from medomni_cas.store.store import Store

__all__ = [
    "MAX_ENTRY_NAME",
    "MAX_TREE_DEPTH",
    "Node",
    "NodeCache",
    "TreeChange",
    "UnexpectedKind",
    "check_entry_name",
    "diff_trees",
    "export_tree",
    "iter_tree",
    "ls_tree",
    "put_directory",
]

#: Deepest folder nesting `export_tree` writes; deeper (crafted) trees are refused up front.
MAX_TREE_DEPTH = 256

# bytes copied per read while exporting a blob
_PIECE = 1 << 20
# objects fetched per batch while reading nodes: blobs may be 1 MiB each, are read whole to
# learn their size, and some backends materialise a whole batch, so this bounds memory at
# about _READ_BATCH MiB
_READ_BATCH = 16


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _at(where: str) -> str:
    return f"at {where!r}" if where else "at the root"


# -- reading tree objects safely ----------------------------------------------------------------
class UnexpectedKind(InvalidObject):
    """An object of a kind that cannot be in a tree (neither blob, chunked blob nor tree)."""

    def __init__(self, oid: ObjectId, kind: str, version: int, where: str) -> None:
        self.id, self.kind, self.version, self.where = oid, kind, version, where
        if where:
            text = (
                f"tree entry {where!r} points at {oid}, a {kind} v{version}: "
                "only blobs and trees can be in a tree"
            )
        else:
            text = f"object {oid} is a {kind} v{version}, not a tree or blob"
        super().__init__(text)


class Node(msgspec.Struct, frozen=True):
    """What an id holds, read and checked from its canonical bytes.

    ``kind`` is ``blob``, ``chunked-blob`` or ``tree``; ``size`` is a blob's length in bytes
    or a tree's number of entries; ``entries`` are a tree's entries, every name checked (shared
    by the cache: do not change them); ``chunks`` are a chunked blob's chunk ids.
    """

    id: ObjectId
    kind: str
    size: int
    entries: Mapping[str, ObjectId] | None = None
    chunks: list[ObjectId] | None = None


def _parse_tree(oid: ObjectId, data: bytes, where: str) -> dict[str, ObjectId]:
    """The validated entries of a tree object's raw bytes; ``where`` names it in errors."""
    try:
        kind, version, body = encoding.decode(data)
    except InvalidObject as e:
        raise InvalidObject(f"tree {oid} {_at(where)}: {e}") from None
    if (kind, version) != (TREE, 1):
        raise InvalidObject(f"object {oid} {_at(where)} is a {kind} v{version}, not a tree")
    try:
        return check_tree_body(body)  # what every way in checks (validate_canonical)
    except InvalidName as e:
        raise InvalidName(f"tree {oid} {_at(where)}: {e}") from None
    except InvalidObject as e:
        raise InvalidObject(f"tree {oid} {_at(where)}: {e}") from None


def _parse_node(oid: ObjectId, data: bytes, where: str) -> Node:
    """The node of an object's verified bytes; anything but a blob, chunked blob or tree is
    refused (`UnexpectedKind`), and so is a malformed one (`InvalidObject`)."""
    try:
        kind, version = encoding.kind_of(data)
        if kind == BLOB:
            return Node(oid, BLOB, len(encoding.blob_data(data)))
    except InvalidObject as e:
        raise InvalidObject(f"object {oid} {_at(where)}: {e}") from None
    if kind == TREE:
        entries = _parse_tree(oid, data, where)
        return Node(oid, TREE, len(entries), entries)
    if kind == CHUNKED and version == ChunkedBlob.__version__:
        try:
            # the record checks its own arithmetic (ChunkedBlob.__post_init__)
            m = encoding.decode_body(data, ChunkedBlob)
        except InvalidObject as e:
            raise InvalidObject(f"chunked blob {oid} {_at(where)}: {e}") from None
        return Node(oid, CHUNKED, m.size, chunks=m.chunks)
    raise UnexpectedKind(oid, kind, version, where)


class NodeCache:
    """Nodes by id, each read and checked once; the one reader of trees for this module
    and the fsspec and zarr views.

    Caching by id is always safe: an id's node never changes. With ``max_nodes`` the cache
    keeps that many nodes, least recently used first out (a tree's entries are kept with
    it); without, it keeps every node it read, which one walk or export needs. Safe to use
    from several threads.

    ``where`` names the path at which an id was found, in errors: ``""`` is a root, not
    reached through any tree, which may be a blob or a tree; anything else is a tree entry.
    """

    def __init__(self, store: Store, max_nodes: int | None = None) -> None:
        self.store = store
        self.max_nodes = max_nodes
        # in order of use when bounded; a plain dict (faster to fill) when not
        self._lru: OrderedDict[ObjectId, Node] | None = None
        self._nodes: dict[ObjectId, Node] = {}
        if max_nodes is not None:
            self._nodes = self._lru = OrderedDict()
        self._lock = threading.Lock()

    def _hit(self, oid: ObjectId) -> Node | None:
        # the caller holds the lock
        node = self._nodes.get(oid)
        if node is not None and self._lru is not None:
            self._lru.move_to_end(oid)
        return node

    def _keep(self, nodes: Iterable[Node]) -> None:
        with self._lock:
            self._nodes.update({node.id: node for node in nodes})
            if self._lru is not None and self.max_nodes is not None:
                for node in nodes:
                    self._lru.move_to_end(node.id)
                while len(self._lru) > self.max_nodes:
                    self._lru.popitem(last=False)

    def cached(self, oid: ObjectId) -> Node | None:
        """The node of ``oid`` if it is in the cache (nothing is read)."""
        with self._lock:
            return self._hit(oid)

    def add(self, node: Node) -> Node:
        """Keep ``node``, e.g. of an object just stored, so that it is never read back."""
        self._keep((node,))
        return node

    def read(self, oid: ObjectId, where: str = "") -> tuple[Node, bytes | None]:
        """The node of ``oid``, and its verified bytes when they were read just now (None
        when it was cached), so that a caller after a small blob's data reads it once."""
        node = self.cached(oid)
        if node is not None:
            return node, None
        try:
            data = self.store.get_raw(oid)
        except NotFound:
            if not where:
                raise
            # the tree names it but this store lacks it (a partial pull)
            raise NotFound("object", f"{oid} (tree entry {where!r})") from None
        return self.add(_parse_node(oid, data, where)), data

    def node(self, oid: ObjectId, where: str = "") -> Node:
        """The node of ``oid``: `NotFound` if the store lacks it, `UnexpectedKind` if it
        cannot be in a tree, `InvalidObject` or `InvalidName` if it is malformed."""
        return self.read(oid, where)[0]

    def nodes(self, batch: Iterable[tuple[ObjectId, str]]) -> dict[ObjectId, Node]:
        """The nodes of many ``(id, where)`` at once, reading the ones not cached in
        batches; every id of ``batch`` is a key of the result."""
        items = list(batch)  # before taking the lock: ``batch`` may be a generator
        out: dict[ObjectId, Node] = {}
        todo: dict[ObjectId, str] = {}
        known = self._nodes
        with self._lock:  # once per call, not once per id: listings are mostly hits
            for oid, where in items:
                node = known.get(oid)
                if node is not None:
                    out[oid] = node
                elif oid not in todo:
                    todo[oid] = where
            if self._lru is not None:
                for oid in out:
                    self._lru.move_to_end(oid)
        ids = list(todo)
        for i in range(0, len(ids), _READ_BATCH):
            read: list[Node] = []
            for oid, data in self.store.get_raw_many(ids[i : i + _READ_BATCH], allow_missing=True):
                if data is None:
                    raise NotFound("object", f"{oid} (tree entry {todo[oid]!r})")
                node = out[oid] = _parse_node(oid, data, todo[oid])
                read.append(node)
            self._keep(read)
        return out

    def entries(self, oid: ObjectId, where: str = "") -> Mapping[str, ObjectId] | None:
        """A tree's checked entries (do not change them), or None when ``oid`` is a blob."""
        return self.node(oid, where).entries


def _root(cache: NodeCache, tree_id: ObjectId | str) -> Node:
    node = cache.node(parse_id(tree_id))
    if node.entries is None:
        raise InvalidObject(f"object {node.id} is a {node.kind}, not a tree")
    return node


def _tree(node: Node) -> Mapping[str, ObjectId]:
    assert node.entries is not None
    return node.entries


# -- listing and walking ------------------------------------------------------------------------
def ls_tree(store: Store, tree_id: ObjectId | str) -> list[tuple[str, ObjectId, str, int]]:
    """One level of a tree: ``(name, id, kind, size)`` sorted by name. The size is a blob's
    length in bytes, or a tree's number of entries."""
    cache = NodeCache(store)
    entries = _tree(_root(cache, tree_id))
    nodes = cache.nodes((oid, name) for name, oid in entries.items())
    return [(name, oid, nodes[oid].kind, nodes[oid].size) for name, oid in sorted(entries.items())]


def iter_tree(store: Store, tree_id: ObjectId | str) -> Iterator[tuple[str, ObjectId, str]]:
    """Every file under a tree, depth first in name order: ``(path, id, kind)`` where kind
    is ``blob`` or ``chunked-blob`` and path joins names with ``/``."""
    cache = NodeCache(store)
    root = _root(cache, tree_id)

    def level(prefix: str, node: Node) -> Iterator[tuple[str, Node]]:
        entries = _tree(node)
        nodes = cache.nodes([(o, _join(prefix, n)) for n, o in entries.items()])
        return iter([(n, nodes[o]) for n, o in sorted(entries.items())])

    # an explicit stack: a crafted tree may be nested deeper than Python's recursion limit
    stack: list[tuple[str, Iterator[tuple[str, Node]]]] = [("", level("", root))]
    while stack:
        prefix, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            continue
        name, node = item
        path = _join(prefix, name)
        if node.kind == TREE:
            stack.append((path, level(path, node)))
        else:
            yield path, node.id, node.kind


# -- diff -----------------------------------------------------------------------------------------
class TreeChange(msgspec.Struct, frozen=True, kw_only=True):
    """One difference between two trees.

    A subtree present on one side only is one change (with the subtree's id), not one per
    file under it: that keeps a diff proportional to what changed, and ``diff == []`` exactly
    when the two ids are equal. An entry that is a file on one side and a folder on the
    other is ``modified``.
    """

    path: str
    change: Literal["added", "removed", "modified"]
    old: ObjectId | None = None
    new: ObjectId | None = None


def diff_trees(store: Store, a: ObjectId | str, b: ObjectId | str) -> list[TreeChange]:
    """The changes that turn tree ``a`` into tree ``b``, sorted by path (component-wise).

    Only subtrees whose ids differ are read: equal ids mean equal contents (Merkle), so an
    unchanged folder costs nothing however large it is.
    """
    cache = NodeCache(store)
    ra, rb = _root(cache, a), _root(cache, b)
    out: list[TreeChange] = []
    stack: list[tuple[str, Node, Node]] = [("", ra, rb)] if ra.id != rb.id else []
    while stack:
        prefix, ta, tb = stack.pop()
        ea, eb = _tree(ta), _tree(tb)
        changed = [n for n in ea.keys() & eb.keys() if ea[n] != eb[n]]
        # only entries that differ on both sides need their kinds: are they both trees?
        na = cache.nodes((ea[n], _join(prefix, n)) for n in changed)
        nb = cache.nodes((eb[n], _join(prefix, n)) for n in changed)
        for n in ea.keys() - eb.keys():
            out.append(TreeChange(path=_join(prefix, n), change="removed", old=ea[n]))
        for n in eb.keys() - ea.keys():
            out.append(TreeChange(path=_join(prefix, n), change="added", new=eb[n]))
        for n in changed:
            path = _join(prefix, n)
            old, new = na[ea[n]], nb[eb[n]]
            if old.kind == TREE and new.kind == TREE:
                stack.append((path, old, new))
            else:
                out.append(TreeChange(path=path, change="modified", old=ea[n], new=eb[n]))
    out.sort(key=lambda c: c.path.split("/"))
    return out


# -- folders in ------------------------------------------------------------------------------------
# A scanned folder: entry name -> a sub-folder, or the real path of a regular file.
type _Dir = dict[str, _Dir | str]


def _refuse_special(path: str, st: os.stat_result) -> None:
    mode = st.st_mode
    what = (
        "a fifo"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file or folder"
    )
    raise InvalidObject(f"{path!r} is {what}: only regular files and folders can be stored")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _scan(root: str, follow_symlinks: bool) -> _Dir:
    """Check a whole folder before storing anything: names, file types, symlinks."""
    real_root = os.path.realpath(root)

    def scan(path: str, real: str, ancestors: frozenset[tuple[int, int]]) -> _Dir:
        out: _Dir = {}
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            full = os.path.join(path, entry.name)
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidName(f"{full!r}: a tree entry name must be valid UTF-8") from None
            try:
                check_entry_name(entry.name)
            except InvalidName as e:
                raise InvalidName(f"{full!r}: {e}") from None
            st = entry.stat(follow_symlinks=False)
            target = os.path.join(real, entry.name)
            if stat.S_ISLNK(st.st_mode):
                if not follow_symlinks:
                    raise InvalidObject(
                        f"{full!r} is a symlink; symlinks are not stored "
                        "(pass follow_symlinks=True to store what it points at)"
                    )
                target = os.path.realpath(full)
                if not _inside(target, real_root):
                    raise InvalidObject(
                        f"symlink {full!r} points outside the folder being stored "
                        f"({target!r} is not under {real_root!r})"
                    )
                try:
                    st = os.stat(target)
                except FileNotFoundError:
                    raise InvalidObject(f"symlink {full!r} is broken: {target!r}") from None
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    raise InvalidObject(f"symlink {full!r} makes a cycle: it leads to {target!r}")
                out[entry.name] = scan(full, target, ancestors | {key})
            elif stat.S_ISREG(st.st_mode):
                out[entry.name] = target
            else:
                _refuse_special(full, st)
        return out

    st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"not a folder: {root!r}")
    return scan(root, real_root, frozenset({(st.st_dev, st.st_ino)}))


def put_directory(
    store: Store,
    path: str | os.PathLike[str],
    *,
    follow_symlinks: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ObjectId:
    """Store a folder as a tree (files as blobs, sub-folders as trees); return its id.

    The whole folder is checked first, so a refused name (`InvalidName`), symlink or special
    file (`InvalidObject`) stores nothing. Symlinks are refused unless ``follow_symlinks``,
    and even then one that leads outside the folder, or into a loop, is refused. ``path``
    itself may be a symlink: it is what the caller named. Empty folders are kept. The folder
    must not change while it is stored; a file swapped for a symlink or special file in the
    meantime is still refused. ``progress`` gets the number of files stored so far.
    """
    root = os.fspath(path)
    plan = _scan(root, follow_symlinks)
    done = 0

    def put_file(shown: str, real: str) -> ObjectId:
        nonlocal done
        # O_NOFOLLOW and O_NONBLOCK: a symlink or fifo swapped in since the scan fails here
        # instead of being followed or blocking forever
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(real, flags)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise InvalidObject(f"{shown!r} became a symlink while being stored") from None
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                _refuse_special(shown, st)
            oid = store.put_blob(f)
        done += 1
        if progress is not None:
            progress(done)
        return oid

    def put(folder: str, d: _Dir) -> ObjectId:
        entries: dict[str, ObjectId] = {}
        for name, child in d.items():
            shown = os.path.join(folder, name)
            entries[name] = put(shown, child) if isinstance(child, dict) else put_file(shown, child)
        return store.put_tree(entries)

    return put(root, plan)


# -- folders out -----------------------------------------------------------------------------------
def _plan_export(store: Store, tree_id: ObjectId | str) -> tuple[Node, dict[ObjectId, Node]]:
    """Read and check every object an export will touch, before writing anything."""
    cache = NodeCache(store)
    root = _root(cache, tree_id)
    memo = {root.id: root}
    frontier = [(root, "")]
    while frontier:
        nxt: list[tuple[Node, str]] = []
        fresh = [
            (child, _join(where, name))
            for node, where in frontier
            for name, child in _tree(node).items()
            if child not in memo
        ]
        got = cache.nodes(fresh)
        for o, w in fresh:
            if o not in memo:
                node = memo[o] = got[o]
                if node.kind == TREE:
                    nxt.append((node, w))
        frontier = nxt
    # chunks are only checked for presence (no bytes read twice): an incomplete tree, e.g.
    # a partial pull, is refused here rather than half exported
    chunks = {c: o for o, n in memo.items() if n.chunks for c in n.chunks}
    absent = store.missing(chunks)
    if absent:
        raise NotFound("object", f"{absent[0]} (a chunk of blob {chunks[absent[0]]})")
    # refuse a crafted chain of trees deeper than any real folder before writing a byte:
    # heights bottom-up over the DAG, iteratively (no recursion limit to hit)
    height: dict[ObjectId, int] = {}
    stack = [root.id]
    while stack:
        oid = stack[-1]
        kids = [c for c in _tree(memo[oid]).values() if memo[c].kind == TREE]
        pending = [c for c in kids if c not in height]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        height[oid] = 1 + max((height[c] for c in kids), default=0)
        if height[oid] > MAX_TREE_DEPTH:
            raise InvalidObject(f"tree {root.id} is nested deeper than {MAX_TREE_DEPTH} folders")
    return root, memo


def _check_target(target: str, overwrite: bool) -> None:
    """Refuse a non-empty target before reading anything (cheap, and writes nothing)."""
    if overwrite or not os.path.lexists(target):
        return
    if not os.path.isdir(target):
        raise NotADirectoryError(f"export target {target!r} is not a folder")
    if os.listdir(target):
        raise FileExistsError(f"export target {target!r} is not empty (pass overwrite=True)")


def _open_target(target: str, overwrite: bool) -> int:
    os.makedirs(target, exist_ok=True)
    # the target itself may be a symlink the caller chose; everything below it is not followed
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    if not overwrite and os.listdir(fd):  # filled since _check_target
        os.close(fd)
        raise FileExistsError(f"export target {target!r} is not empty (pass overwrite=True)")
    return fd


def _lstat_at(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _make_dir(name: str, parent: int, shown: str, overwrite: bool) -> int:
    """Create (or, with overwrite, reuse) a real folder ``name`` under ``parent``; its fd."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        if not overwrite:
            # the target was empty: a clash means two names that this filesystem treats as
            # one (case or Unicode folding), or someone writing into the target meanwhile
            raise FileExistsError(f"{shown!r} already exists") from None
        st = _lstat_at(name, parent)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            # a symlink or file where the tree has a folder: remove it (the link, never what
            # it points at) rather than write through it
            os.unlink(name, dir_fd=parent)
            os.mkdir(name, 0o777, dir_fd=parent)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except OSError as e:  # ELOOP/ENOTDIR: swapped for a symlink since we made it
        raise FileExistsError(f"{shown!r} is not a real folder: {e.strerror}") from None
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileExistsError(f"{shown!r} is not a real folder")
    return fd


def _write_file(
    store: Store, oid: ObjectId, node: Node, name: str, parent: int, shown: str, overwrite: bool
) -> None:
    """Write a blob to ``name`` under ``parent`` via a fresh temporary file and a rename, so
    no half-written file is ever visible and nothing existing is opened or followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = f".medomni-tmp-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, flags, 0o666, dir_fd=parent)
            break
        except FileExistsError:
            continue
    renamed = False
    try:
        with os.fdopen(fd, "wb") as out, store.open_blob(oid) as src:
            written = 0
            while piece := src.read(_PIECE):
                written += len(piece)
                if written > node.size:
                    break
                out.write(piece)
        if written != node.size:
            raise InvalidObject(
                f"blob {oid} at {shown!r} holds {written} bytes, its object says {node.size}"
            )
        existing = _lstat_at(name, parent)
        if existing is not None:
            if not overwrite:
                raise FileExistsError(f"{shown!r} already exists")
            if stat.S_ISDIR(existing.st_mode):
                raise IsADirectoryError(f"{shown!r} is a folder; the tree has a file there")
        # rename replaces a symlink itself, never what it points at
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        renamed = True
    finally:
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)


def export_tree(
    store: Store,
    tree_id: ObjectId | str,
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> int:
    """Write a tree into folder ``target``; return the number of files written.

    ``target`` must be missing or empty unless ``overwrite`` (then files of the tree replace
    files of the same name, and other files are left alone). Every tree and blob is read,
    every name re-checked and every chunk's presence confirmed before anything is written,
    so a crafted or incomplete tree writes nothing; a chunk that turns out corrupt while
    copying leaves no partial file (each file appears whole, by rename, or not at all).
    Writes go through folder descriptors with ``O_NOFOLLOW``/``O_EXCL`` and renames, so no
    symlink inside ``target``, present before or planted during the export, can send a
    write outside it. Blobs are copied in 1 MiB pieces.
    """
    base = os.fspath(target)
    _check_target(base, overwrite)
    root, memo = _plan_export(store, tree_id)
    top = _open_target(base, overwrite)
    count = 0
    # (fd of the folder, its path for messages, its entries in name order, next index)
    stack: list[tuple[int, str, list[tuple[str, ObjectId]], list[int]]] = []
    try:
        stack.append((top, base, sorted(_tree(root).items()), [0]))
        while stack:
            fd, shown, items, pos = stack[-1]
            if pos[0] == len(items):
                stack.pop()
                os.close(fd)
                continue
            name, oid = items[pos[0]]
            pos[0] += 1
            check_entry_name(name)  # checked in the plan already; this is the last line of defence
            node = memo[oid]
            child_shown = os.path.join(shown, name)
            if node.kind == TREE:
                child = _make_dir(name, fd, child_shown, overwrite)
                stack.append((child, child_shown, sorted(_tree(node).items()), [0]))
            else:
                _write_file(store, oid, node, name, fd, child_shown, overwrite)
                count += 1
    finally:
        for fd, *_ in stack:
            os.close(fd)
    return count
