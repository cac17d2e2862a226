"""A read-only fsspec filesystem over the trees of a store: ``medomni://<root>/<path>``.

Registered under the ``fsspec.specs`` entry point, so fsspec, pyarrow and pandas find it::

    fs = fsspec.filesystem("medomni", store=store)  # a Store or a URL; default: workspace
    fs.ls("studio/pairs/x/encoders")
    pq.read_table("dir/t.parquet", filesystem=MedomniFileSystem(store=store, root=ref))
    pd.read_parquet("medomni://studio/pairs/x/encoders/dir/t.parquet",
                    storage_options={"store": store})

Paths
-----
The first segments name the root, the rest is a path inside it:

- the longest run of leading segments that is a ref name wins, so ref names are written with
  their slashes (``studio/pairs/x/encoders/dir/f`` is ``dir/f`` in ref
  ``studio/pairs/x/encoders`` when that ref exists; a ref ``a/b`` shadows entry ``b`` of ref
  ``a``);
- otherwise the first segment is resolved as `Store.resolve` does: a full hex id, a unique
  prefix of at least 8 hex characters, or a one-segment ref name (an id prefix that matches
  an object wins over a ref of the same spelling, as everywhere else).

With ``root=`` the filesystem is one tree and paths start inside it (``""`` is that tree).
A root may be a blob, which is then a file. ``.`` and ``..`` segments are refused
(`InvalidName`); empty segments are ignored. Names returned by ``ls``/``find`` keep the root
as it was written, so globbing and copying see the paths they were given.

Caching
-------
Nodes (what an id is: its kind, size and a tree's entries) are read by the store's
one tree reader, `medomni_cas.store.trees.NodeCache`, and kept by object id, which is always
safe: objects never change. A ref's value may move: each instance reads a ref once and keeps
it until `MedomniFileSystem.invalidate_cache`. Instances are not cached by fsspec
(``cachable = False``), so every ``fsspec.open("medomni://…")`` resolves refs afresh; stores
opened from a URL are shared by all instances in a process, so an LMDB environment is opened
once.

Reads
-----
Reads are verified: every object is re-hashed against its id as it is read, so a corrupt
blob raises `IntegrityError` rather than returning wrong bytes, and a malformed tree or
chunked-blob manifest raises `InvalidObject` from ``ls`` and ``info`` as from ``open``. Files
read in ranges through `Store.open_blob`, with one 1 MiB chunk plus one block of readahead in
memory. Every write (``open("wb")``, ``pipe``, ``put``, ``mkdir``, ``rm``, ``mv``, ``cp``,
``touch``) raises `PermissionError` with errno ``EROFS``: objects are immutable; store a new
tree and move a ref.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any, NoReturn

from fsspec import AbstractFileSystem
from fsspec.spec import AbstractBufferedFile, make_instance

from medomni_cas.errors import AmbiguousId, InvalidId, InvalidName, NotFound
from medomni_cas.store.blobs import BlobReader
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNK_SIZE
from medomni_cas.store.store import Store
from medomni_cas.store.trees import Node, NodeCache, UnexpectedKind
from medomni_cas.store.url import open_store
from medomni_cas.workspace import default_store_url

__all__ = ["MedomniFile", "MedomniFileSystem"]

# nodes an instance remembers (least recently used first out)
_MAX_NODES = 65_536


# -- stores opened from URLs, one per URL per process -------------------------------------------
_SHARED: dict[str, Store] = {}
_SHARED_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):
    # an LMDB environment must not be used across fork: a child opens its own
    os.register_at_fork(after_in_child=_SHARED.clear)


def _absolute(url: str) -> str:
    """A store URL whose local path does not depend on the working directory."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("lmdb", "file") and rest and not os.path.isabs(rest):
        return f"{scheme}://{os.path.abspath(rest)}"
    return url


def _shared_store(key: str) -> Store:
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None:
            # a view never creates a store: a mistyped path is an error, not an empty store
            store = _SHARED[key] = open_store(key, create=False)
        return store


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _read_only(path: object) -> NoReturn:
    raise PermissionError(
        errno.EROFS,
        "medomni:// is read-only (objects are immutable: store a new tree and move a ref)",
        str(path),
    )


class MedomniFileSystem(AbstractFileSystem):
    """Read-only view of a store's trees, as ``medomni://<id, id prefix or ref>/<path>``.

    Parameters
    ----------
    store: a `Store`, or a store URL; default: the workspace's store (never created).
    root: an id, id prefix or ref name; paths are then inside that tree.
    """

    protocol = "medomni"
    root_marker = ""
    # a Store object's repr is its URL, so fsspec's instance cache would conflate two
    # memory:// stores, and a cached instance would keep an old value of a ref forever
    cachable = False

    def __init__(
        self,
        *,
        store: Store | str | None = None,
        root: str | ObjectId | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # the absolute URL of a store opened here, so a pickled instance (dask, process
        # pools) reopens the same store whatever the other side's working directory
        if isinstance(store, Store):
            self._url: str | None = None
            self.store = store
        else:
            self._url = _absolute(store or default_store_url())
            self.store = _shared_store(self._url)
        self.root = root
        self._specs: dict[str, ObjectId] = {}  # root spec -> id, until invalidate_cache
        self._refs: dict[str, dict[str, ObjectId]] = {}  # first segment -> refs under it
        # by id, valid forever; thread-safe, as pyarrow lists and reads from several threads
        self._nodes = NodeCache(self.store, _MAX_NODES)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._url is None:
            return super().__reduce__()  # a live Store object: pickles only if it can
        return make_instance, (
            type(self),
            self.storage_args,
            {**self.storage_options, "store": self._url},
        )

    @property
    def fsid(self) -> str:
        # docstring inherited
        return f"medomni+{self.store.url}"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        # docstring inherited; a medomni path has no leading or trailing "/"
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return super()._strip_protocol(path).strip("/")

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget what refs pointed at (all of them, whatever ``path``); trees stay cached."""
        self._specs.clear()
        self._refs.clear()
        super().invalidate_cache(path)

    # -- paths ------------------------------------------------------------------------------------
    def _parts(self, path: str) -> list[str]:
        text = self._strip_protocol(path)
        parts = [p for p in text.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise InvalidName(f"'.' and '..' are not allowed in a medomni path: {text!r}")
        return parts

    def _resolve(self, spec: str | ObjectId, path: str) -> ObjectId:
        key = spec.hex() if isinstance(spec, ObjectId) else spec
        oid = self._specs.get(key)
        if oid is None:
            try:
                oid = self.store.resolve(spec)
            except (NotFound, InvalidId, AmbiguousId, InvalidName) as e:
                raise FileNotFoundError(
                    errno.ENOENT,
                    f"no object id, id prefix or ref {key!r} in {self.store.url} ({e})",
                    path,
                ) from e
            self._specs[key] = oid
        return oid

    def _refs_under(self, first: str) -> dict[str, ObjectId]:
        refs = self._refs.get(first)
        if refs is None:
            refs = self._refs[first] = dict(self.store.refs.items(first + "/"))
        return refs

    def _parse_path(self, path: str) -> tuple[list[str], int, ObjectId]:
        """The names of ``path``, how many of them spell its root, and the root's id."""
        parts = self._parts(path)
        if self.root is not None:
            return parts, 0, self._resolve(self.root, "")
        if not parts:
            raise FileNotFoundError(
                errno.ENOENT, "a medomni path starts with an object id, id prefix or ref name", ""
            )
        refs = self._refs_under(parts[0])
        if refs:
            for k in range(len(parts), 1, -1):  # the longest ref name wins
                oid = refs.get("/".join(parts[:k]))
                if oid is not None:
                    return parts, k, oid
        try:
            return parts, 1, self._resolve(parts[0], "/".join(parts))
        except FileNotFoundError as e:
            if not refs:
                raise
            raise FileNotFoundError(
                errno.ENOENT,
                f"{e.strerror}; the refs under {parts[0]}/ do not start this path either",
                e.filename,
            ) from e.__cause__

    # -- objects ----------------------------------------------------------------------------------
    def _root_node(self, oid: ObjectId, spec: str) -> Node:
        try:
            return self._nodes.node(oid)
        except NotFound:
            raise FileNotFoundError(errno.ENOENT, f"no object {oid}", spec) from None
        except UnexpectedKind as e:
            raise NotADirectoryError(errno.ENOTDIR, str(e), spec) from None

    def _node_at(self, path: str) -> tuple[str, Node]:
        """The normalised name of ``path`` and the node it names."""
        parts, k, oid = self._parse_path(path)
        shown = "/".join(parts)
        node = self._root_node(oid, "/".join(parts[:k]))
        for i in range(k, len(parts)):
            if node.entries is None:
                raise NotADirectoryError(
                    errno.ENOTDIR, f"{'/'.join(parts[:i])!r} is a file, not a folder", shown
                )
            child = node.entries.get(parts[i])
            if child is None:
                raise FileNotFoundError(errno.ENOENT, "no such file or folder", shown)
            node = self._nodes.node(child, "/".join(parts[: i + 1]))
        return shown, node

    def _file(self, path: str) -> tuple[str, Node]:
        shown, node = self._node_at(path)
        if node.entries is not None:
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", shown)
        return shown, node

    @staticmethod
    def _info(name: str, node: Node) -> dict[str, Any]:
        folder = node.entries is not None
        return {
            "name": name,
            "size": 0 if folder else node.size,
            "type": "directory" if folder else "file",
            "id": node.id.hex(),
            "kind": node.kind,
        }

    # -- reading ----------------------------------------------------------------------------------
    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The entries of a folder (or the file itself), sorted by name."""
        shown, node = self._node_at(path)
        if node.entries is None:
            out = [self._info(shown, node)]
        else:
            items = [(oid, _join(shown, name)) for name, oid in sorted(node.entries.items())]
            nodes = self._nodes.nodes(items)
            out = [self._info(where, nodes[oid]) for oid, where in items]
        return out if detail else [o["name"] for o in out]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """name, size, type (file or directory), the object's id and kind."""
        shown, node = self._node_at(path)
        return self._info(shown, node)

    def checksum(self, path: str) -> int:
        """The object id as an int: equal exactly when the contents are equal."""
        return int.from_bytes(self._node_at(path)[1].id, "big")

    def ukey(self, path: str) -> str:
        """The object id in hex."""
        return self._node_at(path)[1].id.hex()

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes ``start:end`` of a file (negative values count from the end)."""
        node = self._file(path)[1]
        size = node.size
        lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
        hi = size if end is None else (end if end >= 0 else size + end)
        hi = min(hi, size)
        if lo >= hi:
            return b""
        with self.store.open_blob(node.id) as f:  # reads only the chunks in the range
            f.seek(lo)
            return f.read(hi - lo)

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | str | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> MedomniFile:
        # docstring inherited; only "rb": every other mode writes
        if mode != "rb":
            _read_only(path)
        shown, node = self._file(path)
        return MedomniFile(
            self,
            shown,
            node.id,
            node.size,
            block_size=block_size,
            cache_options=cache_options,
            **kwargs,
        )

    # -- writing: refused (docstrings inherited) ---------------------------------------------
    def mkdir(self, path: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def makedirs(self, path: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def rmdir(self, path: str) -> NoReturn:
        _read_only(path)

    def rm(self, path: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def rm_file(self, path: str) -> NoReturn:
        _read_only(path)

    def _rm(self, path: str) -> NoReturn:
        _read_only(path)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> NoReturn:
        _read_only(path2)

    def mv(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path1)

    def pipe_file(self, path: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def put_file(self, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(rpath)

    def touch(self, path: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path)


class MedomniFile(AbstractBufferedFile):
    """A read-only, seekable file over one blob, read in ranges with bounded memory."""

    def __init__(
        self,
        fs: MedomniFileSystem,
        path: str,
        blob_id: ObjectId,
        size: int,
        *,
        block_size: int | str | None = None,
        cache_type: str = "readahead",
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.id = blob_id
        self._reader: BlobReader | None = None
        if block_size in (None, "default"):
            block_size = CHUNK_SIZE  # the unit the store reads anyway
        super().__init__(
            fs,
            path,
            mode="rb",
            block_size=block_size,
            cache_type=cache_type,
            cache_options=cache_options,
            size=size,
            **kwargs,
        )

    def _fetch_range(self, start: int, end: int) -> bytes:
        # docstring inherited
        end = min(end, self.size)
        if start >= end:
            return b""
        if self._reader is None:
            self._reader = self.fs.store.open_blob(self.id)
        self._reader.seek(start)
        return self._reader.read(end - start)

    def close(self) -> None:
        # docstring inherited
        super().close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
