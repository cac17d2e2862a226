"""`make demo`: the store end to end on the embedded default store (./.medomni/store).

Puts the example folder in as a tree, points a ref at it, walks and verifies its closure,
exports it as a bundle and imports that into a second store, then runs fsck. Running it
again writes nothing new: every object is already there, under the same id.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import medomni_cas as mc
from medomni_cas.store import bundle, trees, verify

HERE = Path(__file__).parent
REF = "examples/demo"


def main() -> int:
    store = mc.open()
    before = sum(1 for _ in store.iter_ids())
    tree = trees.put_directory(store, HERE / "demo_data")
    if store.refs.get(REF) != tree:
        store.refs.set(REF, tree, message="make demo")
    after = sum(1 for _ in store.iter_ids())
    print(f"store          {store.url}")
    print(f"tree           {tree}  (ref {REF})")
    print(f"new objects    {after - before} (of {after})")
    for name, oid, kind, size in trees.ls_tree(store, tree):
        print(f"  {kind:12} {size:>8}  {oid.short}  {name}")
    closure = store.closure(tree)
    print(f"closure        {len(closure)} objects, every one re-hashed")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.bundle"
        info = bundle.export_bundle(store, [tree], path, refs={REF: tree})
        other = mc.open("memory://")
        report = bundle.import_bundle(other, path)
        assert other.refs[REF] == tree and other.closure(tree) == closure
        print(f"bundle         {info.objects} objects, {info.bytes} bytes -> imported {report.new}")
    report = verify.fsck(store)
    print(f"fsck           {'ok' if report.ok else 'PROBLEMS'}: {report.objects} objects")
    for p in report.problems:
        print(f"  {p.kind} {p.id}: {p.message}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
