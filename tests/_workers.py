"""Code that the concurrency tests run in child processes (``python -m tests._workers CMD``).

Commands:

* ``writer``: one of several processes writing one LMDB store at once: chained records in
  batches, blobs (one chunked, one shared by every writer), a tree, and CAS appends on a
  shared ref. Prints ``ready`` once the store is open, waits for a go file so that the
  writers really overlap, and prints a JSON report of what it wrote as its last line.
* ``crash``: writes commits forever (records, blobs, a tree, a snapshot, then the refs)
  until it is killed; the content of commit ``n`` depends only on ``n``, so a commit cut
  short by a kill is rewritten identically by the next process. Prints ``ready`` first.
* ``ids``: prints the ids (hex, JSON list) of a fixed set of objects.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import medomni_cas as mc
from medomni_cas.store import encoding
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.encoding import Record
from medomni_cas.store.ids import ObjectId, hash_bytes
from medomni_cas.store.store import Store

SHARED_REF = "shared/log"
SHARED_BLOB_SIZE = (1 << 20) + (1 << 19)  # chunked: one 1 MiB chunk and one 512 KiB chunk


class Item(Record, kw_only=True):
    __kind__ = "test-item"

    n: int
    who: str
    prev: ObjectId | None = None


class Snapshot(Record, kw_only=True):
    """One commit of the crash writer: its number, the tips of its item chains (short, so
    that a walk is not one level per item), its blob tree and the previous commit."""

    __kind__ = "test-snapshot"

    n: int
    items: list[ObjectId]
    tree: ObjectId
    parent: ObjectId | None = None


class Doc(Record, kw_only=True):
    """A record with every kind of field the canonical encoding must order and size."""

    __kind__ = "test-doc"

    title: str
    meta: dict[str, Any]
    values: list[Any]
    tags: frozenset[str] = frozenset()
    link: ObjectId | None = None


class CountingEnv:
    """An LMDB environment that counts map resizes: doublings (after MapFullError) and
    adoptions of a size another process grew the map to (after MapResizedError)."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.grown = 0
        self.adopted = 0

    def set_mapsize(self, size: int) -> None:
        if size == 0:
            self.adopted += 1
        else:
            self.grown += 1
        self._env.set_mapsize(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def open_store(path: str, map_size: int | None) -> Store:
    if map_size is None:
        return mc.open(f"lmdb://{path}")
    return Store(LMDBBackend(path, map_size=map_size))


def item_id(item: Item) -> ObjectId:
    return hash_bytes(encoding.encode(item))


def _bytes(seed: str, size: int) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


def shared_blob() -> bytes:
    return _bytes("shared", SHARED_BLOB_SIZE)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- several writers at once --------------------------------------------------------------------
def writer(args: argparse.Namespace) -> None:
    who: str = args.who
    store = open_store(args.path, args.map_size)
    env = store.backend.env = CountingEnv(store.backend.env)  # type: ignore[attr-defined]
    print("ready", flush=True)
    go = Path(args.go)
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go file")
        time.sleep(0.005)

    report: dict[str, Any] = {"who": who, "items": [], "appends": [], "blobs": {}}
    own_ref = f"procs/{who}"
    tree_ref = f"trees/{who}"
    prev: ObjectId | None = None
    blob_entries: dict[str, ObjectId] = {}
    n_batches = args.records // args.batch
    blob_specs = [
        ("empty", b""),
        ("one", _bytes(f"{who}-one", 1)),
        ("small", _bytes(f"{who}-small", 1000)),
        ("large", _bytes(f"{who}-large", 300_000)),  # one object, in a file beside LMDB
        ("chunked", _bytes(f"{who}-chunked", (1 << 20) + 12_345)),  # chunked, 2 chunks
        ("shared", shared_blob()),  # the same bytes in every writer, written concurrently
    ]
    for b in range(n_batches):
        batch: list[Item] = []
        ids: list[ObjectId] = []
        for i in range(b * args.batch, (b + 1) * args.batch):
            item = Item(n=i, who=who, prev=prev)
            batch.append(item)
            prev = item_id(item)
            ids.append(prev)
        got = store.put_many(batch)
        if got != ids:
            raise SystemExit(f"{who}: put_many returned other ids than encode+hash")
        report["items"].extend(i.hex() for i in ids)
        old = store.refs.get(own_ref)
        store.refs.set(own_ref, ids[-1], expected=old, message=f"batch {b}")

        for _ in range(args.appends):
            k = len(report["appends"])

            def append(current: ObjectId | None, k: int = k) -> ObjectId:
                return store.put(Item(n=k, who=f"append:{who}", prev=current))

            new = store.refs.update(SHARED_REF, append, message=f"{who} {k}")
            assert new is not None
            report["appends"].append(new.hex())

        if b % max(1, n_batches // len(blob_specs)) == 0 and blob_specs:
            name, data = blob_specs.pop(0)
            oid = store.put_blob(data)
            blob_entries[name] = oid
            report["blobs"][oid.hex()] = _sha(data)
            tree = store.put_tree(blob_entries)
            store.refs.set(tree_ref, tree, expected=store.refs.get(tree_ref))
    for name, data in blob_specs:  # any left over
        oid = store.put_blob(data)
        blob_entries[name] = oid
        report["blobs"][oid.hex()] = _sha(data)
        tree = store.put_tree(blob_entries)
        store.refs.set(tree_ref, tree, expected=store.refs.get(tree_ref))
    report["map_size"] = env.info()["map_size"]
    report["grown"], report["adopted"] = env.grown, env.adopted
    store.close()
    print(json.dumps(report), flush=True)


# -- a writer that is killed --------------------------------------------------------------------
HEAD = "heads/main"
BLOBS = "heads/blobs"


CHAIN = 32


def commit_content(n: int) -> tuple[list[Item], dict[str, bytes]]:
    """The records and blobs of commit ``n``, a function of ``n`` only. Records come in
    chains of `CHAIN`: each links the one before it, the first of a chain links nothing."""
    rng = random.Random(n)
    items = []
    prev = None
    for i in range(rng.randint(50, 250)):
        item = Item(n=i, who=f"commit-{n}", prev=None if i % CHAIN == 0 else prev)
        items.append(item)
        prev = item_id(item)
    blobs = {f"b{j}": _bytes(f"c{n}-{j}", rng.randint(0, 5000)) for j in range(rng.randint(1, 6))}
    if n % 3 == 1:
        blobs["large"] = _bytes(f"c{n}-large", rng.randint(260_000, 900_000))
    if n % 3 == 2:
        blobs["chunked"] = _bytes(f"c{n}-chunked", rng.randint((1 << 20) + 1, 5 << 20 >> 1))
    return items, blobs


def crash(args: argparse.Namespace) -> None:
    store = open_store(args.path, args.map_size)
    print("ready", flush=True)
    while True:
        head = store.refs.get(HEAD)
        snap = None if head is None else store.get(head, Snapshot)
        n = 0 if snap is None else snap.n + 1
        items, blobs = commit_content(n)
        ids: list[ObjectId] = []
        for i in range(0, len(items), 64):
            ids.extend(store.put_many(items[i : i + 64]))
        tips = [ids[i] for i in range(CHAIN - 1, len(ids), CHAIN)]
        if len(ids) % CHAIN:
            tips.append(ids[-1])
        tree_entries = {name: store.put_blob(data) for name, data in blobs.items()}
        old_tree = store.refs.get(BLOBS)
        if old_tree is not None:
            tree_entries["prev"] = old_tree
        tree = store.put_tree(tree_entries)
        new = store.put(Snapshot(n=n, items=tips, tree=tree, parent=head))
        # the ref moves only after everything it reaches is written
        store.refs.set(BLOBS, tree, expected=old_tree, message=f"commit {n}")
        store.refs.set(HEAD, new, expected=head, message=f"commit {n}")
        print(f"commit {n}", flush=True)


# -- the same ids in every process --------------------------------------------------------------
INTS = [
    0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
    2**53, 2**63 - 1, 2**64 - 1,
    -1, -31, -32, -33, -127, -128, -129, -32_767, -32_768, -32_769,
    -(2**31) + 1, -(2**31), -(2**31) - 1, -(2**63),
]  # fmt: skip
FLOATS = [0.0, 1.0, -1.5, 0.1, 1 / 3, 2.0**53, 1e308, 5e-324, 2.2250738585072014e-308, 1e-7]
STRINGS = [
    "", "a", "é", "e\u0301", "日本語", "😀", "\uffff", "\x00nul", "Ωmega", "x" * 31, "y" * 32,
    "z" * 255, "w" * 256, "ü" * 40_000,
]  # fmt: skip


def fixed_ids() -> list[str]:
    """Ids of a fixed set of objects. Dicts and sets are built by iterating sets of strings,
    whose order depends on PYTHONHASHSEED: the ids must not."""
    store = mc.open("memory://")
    out: list[ObjectId] = []
    keys = set(STRINGS[:12]) | {f"k{i}" for i in range(50)}
    meta: dict[str, Any] = {k: len(k) for k in keys}  # insertion order varies with the seed
    meta["nested"] = {k: {"deeper": [k, {k: k}]} for k in keys}
    meta["ints"] = {str(i): i for i in INTS}
    meta["floats"] = list(FLOATS)
    blobs = [
        store.put_blob(b""),
        store.put_blob(b"\x00"),
        store.put_blob(_bytes("ids-1m", 1 << 20)),
        store.put_blob(_bytes("ids-1m", (1 << 20) + 1)),
        store.put_blob(_bytes("ids-3m", 3 << 20)),
        store.put_blob(b"\xff" * 255),
        store.put_blob(b"\xff" * 256),
        store.put_blob(b"\xff" * 65_536),
    ]
    out.extend(blobs)
    prev = None
    for i in INTS:
        prev = store.put(Item(n=i, who="ints", prev=prev))
        out.append(prev)
    for s in STRINGS:
        out.append(store.put(Item(n=len(s), who=s)))
    for f in FLOATS:
        out.append(store.put(Doc(title="float", meta={"f": f}, values=[f, -f if f else 0.0])))
    doc = Doc(
        title="日本語 😀 é",
        meta=meta,
        values=[*INTS, *FLOATS, *STRINGS, None, True, False, [], {}, [[]], blobs[0]],
        tags=frozenset(keys),
        link=prev,
    )
    out.append(store.put(doc))
    out.append(store.put(Doc(title="", meta={}, values=[])))
    out.append(store.put_object("test-raw", 3, {"set": set(keys), "links": blobs, "meta": meta}))
    names = set(STRINGS[1:11]) - {"\x00nul"} | {f"file-{i}.txt" for i in range(30)}
    inner = store.put_tree({name: blobs[i % len(blobs)] for i, name in enumerate(sorted(names))})
    entries = {name: blobs[len(name) % len(blobs)] for name in names}  # order varies
    out.append(inner)
    out.append(store.put_tree({"inner": inner, **entries}))
    out.append(store.put_tree({}))
    return [o.hex() for o in out]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests._workers")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--path", required=True)
    w.add_argument("--map-size", type=int)
    w.add_argument("--who", required=True)
    w.add_argument("--records", type=int, default=3000)
    w.add_argument("--batch", type=int, default=100)
    w.add_argument("--appends", type=int, default=1, help="shared-ref appends per batch")
    w.add_argument("--go", required=True)
    c = sub.add_parser("crash")
    c.add_argument("--path", required=True)
    c.add_argument("--map-size", type=int)
    sub.add_parser("ids")
    args = p.parse_args(argv)
    if args.cmd == "writer":
        writer(args)
    elif args.cmd == "crash":
        crash(args)
    else:
        print(json.dumps(fixed_ids()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
