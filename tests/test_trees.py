"""Trees: folders in and out byte for byte, crafted trees refused, diffs that skip equal ids."""

from __future__ import annotations

import ast
import os
import random
import shutil
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store import objects, trees
from medomni_cas.store.blobs import BlobReader
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNK_SIZE, ChunkedBlob
from medomni_cas.store.trees import (
    MAX_TREE_DEPTH,
    Node,
    NodeCache,
    TreeChange,
    UnexpectedKind,
    diff_trees,
    export_tree,
    iter_tree,
    ls_tree,
    put_directory,
)

BIG = int(2.6 * CHUNK_SIZE)


def make_folder(root: Path) -> Path:
    """Nested folders, an empty folder, an empty file, a binary file and a chunked file."""
    (root / "docs" / "deep" / "er").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "docs" / "readme.txt").write_text("hello\n")
    (root / "docs" / "deep" / "er" / "note.md").write_text("# note\n")
    (root / "zero").write_bytes(b"")
    (root / "bin.dat").write_bytes(bytes(range(256)) * 17 + b"\x00\xff")
    (root / "big.raw").write_bytes(random.Random(1).randbytes(BIG))
    (root / "ünïcode name.txt").write_text("utf-8 names\n")
    return root


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root: file bytes, or None for a folder (symlinks must not exist)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            assert not p.is_symlink(), f"unexpected symlink {p}"
            out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "src")


# -- folders in and out ----------------------------------------------------------------------------
def test_round_trip_byte_for_byte(store: mc.Store, src: Path, tmp_path: Path) -> None:
    tree = put_directory(store, src)
    out = tmp_path / "out"
    assert export_tree(store, tree, out) == 6
    assert snapshot(out) == snapshot(src)
    assert (out / "empty").is_dir() and not any((out / "empty").iterdir())
    assert not [p for p in out.rglob(".medomni-tmp-*")]


def test_same_folder_same_id_anywhere(store: mc.Store, src: Path, tmp_path: Path) -> None:
    first = put_directory(store, src)
    assert put_directory(store, src) == first
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(src, copy)
    os.utime(copy / "zero", (0, 0))  # metadata is not content
    assert put_directory(store, copy) == first
    (copy / "docs" / "deep" / "er" / "note.md").write_text("# changed\n")
    assert put_directory(store, copy) != first


def test_tree_shape_and_kinds(store: mc.Store, src: Path) -> None:
    tree = put_directory(store, src)
    rows = {name: (kind, size) for name, _, kind, size in ls_tree(store, tree)}
    assert rows == {
        "big.raw": ("chunked-blob", BIG),
        "bin.dat": ("blob", 256 * 17 + 2),
        "docs": ("tree", 2),
        "empty": ("tree", 0),
        "zero": ("blob", 0),
        "ünïcode name.txt": ("blob", 12),
    }
    assert [name for name, *_ in ls_tree(store, tree)] == sorted(rows)
    assert store.get(tree)["empty"] == store.put_tree({})
    files = list(iter_tree(store, tree))
    assert [(p, k) for p, _, k in files] == [
        ("big.raw", "chunked-blob"),
        ("bin.dat", "blob"),
        ("docs/deep/er/note.md", "blob"),
        ("docs/readme.txt", "blob"),
        ("zero", "blob"),
        ("ünïcode name.txt", "blob"),
    ]
    for path, oid, _ in files:
        assert store.read_blob(oid) == (src / path).read_bytes()


def test_empty_folder_is_the_empty_tree(store: mc.Store, tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()
    tree = put_directory(store, tmp_path / "nothing")
    assert tree == store.put_tree({})
    assert export_tree(store, tree, tmp_path / "out") == 0
    assert (tmp_path / "out").is_dir()


def test_progress_counts_files(store: mc.Store, src: Path) -> None:
    seen: list[int] = []
    put_directory(store, src, progress=seen.append)
    assert seen == [1, 2, 3, 4, 5, 6]


def test_not_a_folder(store: mc.Store, src: Path) -> None:
    with pytest.raises(NotADirectoryError, match="zero"):
        put_directory(store, src / "zero")


# -- what a folder may not hold --------------------------------------------------------------------
def keys(store: mc.Store) -> set[ObjectId]:
    return set(store.iter_ids())


@pytest.mark.parametrize("name", ["back\\slash", "a\\..\\b"])
def test_bad_name_on_disk_is_refused(store: mc.Store, src: Path, name: str) -> None:
    (src / "docs" / name).write_text("x")
    before = keys(store)
    with pytest.raises(mc.InvalidName, match="separator") as e:
        put_directory(store, src)
    assert str(src / "docs") in str(e.value)
    assert keys(store) == before  # checked before anything was stored


def test_undecodable_name_is_refused(store: mc.Store, src: Path) -> None:
    try:
        fd = os.open(os.fsencode(src) + b"/bad\xff", os.O_CREAT | os.O_WRONLY, 0o644)
    except OSError:
        pytest.skip("this filesystem refuses non-UTF-8 names")
    os.close(fd)
    with pytest.raises(mc.InvalidName, match="UTF-8"):
        put_directory(store, src)


def test_symlink_in_source_is_refused(store: mc.Store, src: Path) -> None:
    os.symlink("readme.txt", src / "docs" / "link")
    before = keys(store)
    with pytest.raises(mc.InvalidObject, match="symlink") as e:
        put_directory(store, src)
    assert str(src / "docs" / "link") in str(e.value)
    assert keys(store) == before


def test_followed_symlinks_inside_the_folder(store: mc.Store, src: Path) -> None:
    os.symlink("readme.txt", src / "docs" / "link")
    os.symlink("docs/deep", src / "alias")
    tree = put_directory(store, src, follow_symlinks=True)
    docs = store.get(store.get(tree)["docs"])
    assert docs["link"] == docs["readme.txt"]
    assert store.get(tree)["alias"] == docs["deep"]


def test_followed_symlink_leaving_the_folder_is_refused(
    store: mc.Store, src: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text("outside")
    os.symlink(tmp_path / "secret", src / "docs" / "escape")
    with pytest.raises(mc.InvalidObject, match="outside") as e:
        put_directory(store, src, follow_symlinks=True)
    assert "escape" in str(e.value)
    os.unlink(src / "docs" / "escape")
    os.symlink("../../src/../src/docs/../../secret", src / "docs" / "sneaky")
    with pytest.raises(mc.InvalidObject, match="outside"):
        put_directory(store, src, follow_symlinks=True)


def test_followed_symlink_loop_and_dangling(store: mc.Store, src: Path) -> None:
    os.symlink("..", src / "docs" / "up")
    with pytest.raises(mc.InvalidObject, match="cycle"):
        put_directory(store, src, follow_symlinks=True)
    os.unlink(src / "docs" / "up")
    os.symlink("nowhere", src / "docs" / "dangling")
    with pytest.raises(mc.InvalidObject, match="broken"):
        put_directory(store, src, follow_symlinks=True)


def test_fifo_is_refused(store: mc.Store, src: Path) -> None:
    os.mkfifo(src / "docs" / "pipe")
    with pytest.raises(mc.InvalidObject, match="fifo") as e:
        put_directory(store, src)
    assert "pipe" in str(e.value)


# -- crafted trees ---------------------------------------------------------------------------------
BAD_NAMES = ["..", ".", "", "../evil", "/abs", "a/b", "nul\x00", "back\\slash", "x" * 256]


@pytest.fixture
def outside(tmp_path: Path) -> tuple[Path, Path]:
    """A parent folder and the export target inside it."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "witness").write_text("untouched")
    return parent, parent / "target"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_crafted_tree_is_refused_and_writes_nothing(
    store: mc.Store, outside: tuple[Path, Path], name: str
) -> None:
    parent, target = outside
    blob = store.put_blob(b"pwned")
    crafted = store.put_object("tree", 1, {name: blob})
    # nested one level down too, behind a good entry that would be written first
    wrapper = store.put_object("tree", 1, {"a-good": store.put_tree({"f": blob}), "sub": crafted})
    with pytest.raises(ValueError):  # the constructor refuses it, so Tree() is not the guard
        mc.Tree({name: blob})

    for tree, where in ((crafted, "the root"), (wrapper, "'sub'")):
        with pytest.raises(mc.InvalidName) as e:
            export_tree(store, tree, target)
        assert where in str(e.value)
        assert listing(parent) == ["witness"]  # not even the target was made
        with pytest.raises(mc.InvalidName):
            list(iter_tree(store, tree))
        # diff reads a subtree only where both sides differ, so give it a "sub" to compare
        with pytest.raises(mc.InvalidName):
            diff_trees(store, store.put_tree({"sub": store.put_tree({})}), tree)
    with pytest.raises(mc.InvalidName):
        ls_tree(store, crafted)
    assert not (parent.parent / "evil").exists()


def test_crafted_tree_into_existing_target_with_overwrite(
    store: mc.Store, outside: tuple[Path, Path]
) -> None:
    parent, target = outside
    target.mkdir()
    blob = store.put_blob(b"pwned")
    crafted = store.put_object("tree", 1, {"ok": blob, "../witness": blob})
    with pytest.raises(mc.InvalidName, match=r"\.\./witness"):
        export_tree(store, crafted, target, overwrite=True)
    assert (parent / "witness").read_text() == "untouched"
    assert listing(target) == []


def test_entry_that_is_not_a_blob_or_tree(store: mc.Store, tmp_path: Path) -> None:
    record = store.put_object("note", 1, {"text": "not a file"})
    crafted = store.put_object("tree", 1, {"dir": store.put_object("tree", 1, {"odd": record})})
    with pytest.raises(mc.InvalidObject, match=r"'dir/odd'.*note") as e:
        export_tree(store, crafted, tmp_path / "out")
    assert str(record) in str(e.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(mc.InvalidObject, match="dir/odd"):
        list(iter_tree(store, crafted))


def test_entry_that_is_not_a_link(store: mc.Store, tmp_path: Path) -> None:
    crafted = store.put_object("tree", 1, {"f": "deadbeef"})
    with pytest.raises(mc.InvalidObject, match="not a link"):
        export_tree(store, crafted, tmp_path / "out")


def test_root_must_be_a_tree(store: mc.Store, tmp_path: Path) -> None:
    blob = store.put_blob(b"x")
    with pytest.raises(mc.InvalidObject, match="not a tree"):
        export_tree(store, blob, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_object_writes_nothing(store: mc.Store, tmp_path: Path) -> None:
    blob = store.put_blob(b"soon gone")
    tree = store.put_tree({"a": store.put_blob(b"stays"), "b": blob})
    store.backend.delete_many([blob])
    with pytest.raises(mc.NotFound, match=str(blob)):
        export_tree(store, tree, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_chunk_writes_nothing(store: mc.Store, tmp_path: Path) -> None:
    big = store.put_blob(random.Random(2).randbytes(2 * CHUNK_SIZE + 1))
    tree = store.put_tree({"a": store.put_blob(b"small"), "big": big})
    chunk = store.get(big, ChunkedBlob).chunks[1]
    store.backend.delete_many([chunk])
    with pytest.raises(mc.NotFound, match=f"{chunk}.*{big}"):
        export_tree(store, tree, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_chunk_leaves_no_partial_file(store: mc.Store, tmp_path: Path) -> None:
    big = store.put_blob(random.Random(2).randbytes(2 * CHUNK_SIZE + 1))
    tree = store.put_tree({"a": store.put_blob(b"small"), "big": big})
    chunk = store.get(big, ChunkedBlob).chunks[1]
    # present but rotten: only found while copying, after "a" was written
    store.backend.delete_many([chunk])
    store.backend.put_many([(chunk, b"rotten bytes")])
    out = tmp_path / "out"
    with pytest.raises(mc.IntegrityError, match=str(chunk)):
        export_tree(store, tree, out)
    assert listing(out) == ["a"]  # no "big", no temporary file


def test_crafted_manifest_is_refused(store: mc.Store, tmp_path: Path) -> None:
    chunk = store.put_blob(b"x" * 10)
    # two chunks of 10 bytes cannot hold 100 (the record refuses to be made so: craft it)
    body = {"size": 100, "chunk_size": 10, "chunks": [chunk, chunk]}
    bad = store.put_object("chunked-blob", 1, body)
    tree = store.put_tree({"f": bad})
    for read in (ls_tree, iter_tree):
        with pytest.raises(mc.InvalidObject, match=f"{bad} at 'f'.*does not fit"):
            list(read(store, tree))
    with pytest.raises(mc.InvalidObject, match="does not fit"):
        export_tree(store, tree, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_crafted_deep_tree_is_refused_up_front(store: mc.Store, tmp_path: Path) -> None:
    tree = store.put_tree({"f": store.put_blob(b"x")})
    for _ in range(MAX_TREE_DEPTH):
        tree = store.put_tree({"d": tree})
    with pytest.raises(mc.InvalidObject, match="deeper"):
        export_tree(store, tree, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- symlinks inside the target --------------------------------------------------------------------
def test_target_must_be_empty(store: mc.Store, src: Path, tmp_path: Path) -> None:
    tree = put_directory(store, src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_tree(store, tree, out)
    assert listing(out) == ["keep"]
    assert export_tree(store, tree, out, overwrite=True) == 6
    assert (out / "keep").read_text() == "mine"
    assert (out / "docs" / "readme.txt").read_text() == "hello\n"


def test_planted_symlinks_are_not_followed(store: mc.Store, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    blob = store.put_blob(b"from the tree")
    tree = store.put_tree({"sub": store.put_tree({"f": blob}), "v": blob})
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / "sub")  # a folder of the tree
    os.symlink(victim, out / "v")  # a file of the tree

    with pytest.raises(FileExistsError):
        export_tree(store, tree, out)
    assert export_tree(store, tree, out, overwrite=True) == 2
    assert listing(elsewhere) == []
    assert victim.read_text() == "original"
    assert not (out / "sub").is_symlink() and (out / "sub" / "f").read_bytes() == b"from the tree"
    assert not (out / "v").is_symlink() and (out / "v").read_bytes() == b"from the tree"


class SwappingStore(mc.Store):
    """A real store that, as the first blob is opened, moves the folder being exported
    away and plants a symlink to ``elsewhere`` in its place: the race an attacker with
    write access to the target would try."""

    def __init__(self, store: mc.Store, folder: Path, elsewhere: Path) -> None:
        super().__init__(store.backend)
        self.folder, self.elsewhere, self.done = folder, elsewhere, False

    def open_blob(self, oid: ObjectId | str) -> BlobReader:
        if not self.done:
            self.done = True
            self.folder.rename(self.folder.with_name("moved"))
            os.symlink(self.elsewhere, self.folder)
        return super().open_blob(oid)


def test_symlink_swapped_in_during_export_is_not_followed(store: mc.Store, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    a, b = store.put_blob(b"first"), store.put_blob(b"second")
    tree = store.put_tree({"sub": store.put_tree({"f1": a, "f2": b})})
    out = tmp_path / "out"
    swapping = SwappingStore(store, out / "sub", elsewhere)
    assert export_tree(swapping, tree, out) == 2
    assert swapping.done
    assert listing(elsewhere) == []
    # every write went through the descriptor of the real folder, wherever it moved
    assert (out / "moved" / "f1").read_bytes() == b"first"
    assert (out / "moved" / "f2").read_bytes() == b"second"


# -- diff ------------------------------------------------------------------------------------------
def test_diff_trees(store: mc.Store, src: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(src, other)
    (other / "docs" / "readme.txt").write_text("changed\n")  # modified, nested
    (other / "docs" / "deep" / "er" / "new.txt").write_text("new\n")  # added, deep
    (other / "bin.dat").unlink()  # removed
    (other / "zero").unlink()
    (other / "zero").mkdir()  # file -> folder
    shutil.rmtree(other / "empty")  # folder removed
    (other / "fresh" / "x").mkdir(parents=True)  # folder added (one change)
    a, b = put_directory(store, src), put_directory(store, other)

    changes = diff_trees(store, a, b)
    assert [(c.path, c.change) for c in changes] == [
        ("bin.dat", "removed"),
        ("docs/deep/er/new.txt", "added"),
        ("docs/readme.txt", "modified"),
        ("empty", "removed"),
        ("fresh", "added"),
        ("zero", "modified"),
    ]
    by_path = {c.path: c for c in changes}
    readme = by_path["docs/readme.txt"]
    assert store.read_blob(readme.old) == b"hello\n"  # type: ignore[arg-type]
    assert store.read_blob(readme.new) == b"changed\n"  # type: ignore[arg-type]
    assert by_path["bin.dat"].new is None and by_path["fresh"].old is None
    assert store.kind(by_path["fresh"].new) == "tree"  # type: ignore[arg-type]
    assert diff_trees(store, a, a) == []
    assert [(c.path, c.change) for c in diff_trees(store, b, a)] == [
        ("bin.dat", "added"),
        ("docs/deep/er/new.txt", "removed"),
        ("docs/readme.txt", "modified"),
        ("empty", "added"),
        ("fresh", "removed"),
        ("zero", "modified"),
    ]
    assert isinstance(changes[0], TreeChange)


def test_diff_does_not_descend_into_equal_subtrees(store: mc.Store) -> None:
    shared_file = store.put_blob(b"only under the shared folder")
    shared = store.put_tree({"inner": store.put_tree({"f": shared_file})})
    a = store.put_tree({"shared": shared, "x": store.put_blob(b"1")})
    b = store.put_tree({"shared": shared, "x": store.put_blob(b"2")})
    # the unchanged subtree and everything under it vanish from the store…
    inner = store.get(shared)["inner"]
    assert store.backend.delete_many([shared, inner, shared_file]) == 3
    # …and the diff does not notice, because equal ids are never read
    assert [(c.path, c.change) for c in diff_trees(store, a, b)] == [("x", "modified")]
    with pytest.raises(mc.NotFound):  # whereas a walk does read them
        list(iter_tree(store, a))


def test_diff_sorts_by_path_components(store: mc.Store) -> None:
    blob = store.put_blob(b"x")
    a = store.put_tree({})
    b = store.put_tree({"a-b": blob, "a": store.put_tree({"b": blob}), "a.c": blob})
    # "a" then "a-b": a folder sorts before names it is a prefix of, as in a walk
    assert [c.path for c in diff_trees(store, a, b)] == ["a", "a-b", "a.c"]
    old = store.put_tree({"a": store.put_tree({"b": blob, "c": blob}), "a-b": blob})
    new = store.put_tree({"a": store.put_tree({"b": blob}), "a-b": store.put_blob(b"y")})
    assert [c.path for c in diff_trees(store, old, new)] == ["a/c", "a-b"]


def test_crafted_manifest_with_long_chunks_writes_no_file(store: mc.Store, tmp_path: Path) -> None:
    long = store.put_blob(b"x" * 30)
    bad = store.put(ChunkedBlob(size=40, chunk_size=20, chunks=[long, long]))
    out = tmp_path / "out"
    with pytest.raises(mc.InvalidObject, match="f"):
        export_tree(store, store.put_tree({"f": bad}), out)
    assert listing(out) == []


def test_objects_does_not_import_trees() -> None:
    # the entry-name rules live in objects.py so that Tree checks names without a cycle
    # (objects -> trees -> objects); trees re-exports them
    nodes = list(ast.walk(ast.parse(Path(objects.__file__).read_text())))
    imported = {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in nodes if isinstance(n, ast.Import) for a in n.names
    }
    assert not {m for m in imported if m.startswith("medomni_cas.store.trees")}
    assert trees.check_entry_name is objects.check_entry_name
    assert trees.MAX_ENTRY_NAME == objects.MAX_ENTRY_NAME == 255


# -- the node reader ---------------------------------------------------------------------------
def test_nodes_say_what_an_id_holds(store: mc.Store) -> None:
    small, big = store.put_blob(b"hello"), store.put_blob(b"x" * (CHUNK_SIZE + 1))
    tree = store.put_tree({"small": small, "big": big})
    cache = NodeCache(store)
    node, data = cache.read(tree)
    assert (node.id, node.kind, node.size, dict(node.entries or {})) == (
        tree,
        "tree",
        2,
        {"big": big, "small": small},
    )
    assert data == store.get_raw(tree)  # read just now
    assert cache.read(tree) == (node, None)  # cached: nothing read
    nodes = cache.nodes([(small, "small"), (big, "big"), (small, "small")])
    assert set(nodes) == {small, big}
    assert (nodes[small].kind, nodes[small].size, nodes[small].entries) == ("blob", 5, None)
    assert (nodes[big].kind, nodes[big].size) == ("chunked-blob", CHUNK_SIZE + 1)
    assert nodes[big].chunks == store.get(big, ChunkedBlob).chunks
    assert cache.entries(small) is None and cache.entries(tree) == node.entries


def test_node_cache_keeps_the_most_recently_used(store: mc.Store) -> None:
    a, b, c = (store.put_blob(x) for x in (b"a", b"b", b"c"))
    cache = NodeCache(store, max_nodes=2)
    cache.node(a)
    cache.node(b)
    cache.node(a)  # a is now more recent than b
    cache.node(c)
    assert cache.cached(a) is not None and cache.cached(c) is not None
    assert cache.cached(b) is None
    cache.nodes([(a, "a")])  # a hit in a batch counts as a use too
    cache.nodes([(b, "b")])
    assert cache.cached(a) is not None and cache.cached(b) is not None
    assert cache.cached(c) is None
    unbounded = NodeCache(store)
    for oid in (a, b, c):
        unbounded.node(oid)
    assert all(unbounded.cached(o) is not None for o in (a, b, c))


def test_an_added_node_is_never_read(store: mc.Store) -> None:
    blob = store.put_blob(b"just stored")
    cache = NodeCache(store)
    cache.add(Node(blob, "blob", 11))
    store.backend.delete_many([blob])  # a read would now fail
    assert cache.node(blob).size == 11


def test_node_errors_name_the_id_and_where_it_was_found(store: mc.Store) -> None:
    record = store.put_object("note", 1, {"text": "not a file"})
    cache = NodeCache(store)
    with pytest.raises(UnexpectedKind, match=f"object {record} is a note v1, not a tree") as e:
        cache.node(record)  # a root
    assert (e.value.id, e.value.kind, e.value.version, e.value.where) == (record, "note", 1, "")
    with pytest.raises(UnexpectedKind, match=f"tree entry 'd/n' points at {record}, a note v1"):
        cache.nodes([(record, "d/n")])
    assert isinstance(e.value, mc.InvalidObject)
    ghost = ObjectId(bytes(32))
    with pytest.raises(mc.NotFound, match=f"{ghost} \\(tree entry 'd/g'\\)"):
        cache.node(ghost, "d/g")
    with pytest.raises(mc.NotFound, match=f"{ghost} \\(tree entry 'd/g'\\)"):
        cache.nodes([(ghost, "d/g")])
    with pytest.raises(mc.NotFound, match=str(ghost)):
        cache.node(ghost)
    crafted = store.put_object("tree", 1, {"../up": store.put_blob(b"x")})
    with pytest.raises(mc.InvalidName, match=f"tree {crafted} at 'sub'.*path separator"):
        cache.node(crafted, "sub")
