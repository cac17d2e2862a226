"""A corrupt object can be repaired: by a put of its bytes, an import, a pull, and
``medomni cas fsck --repair --from URL``; after which gc runs again.

Objects are damaged around the store, in its real storage (an LMDB value, a file of a
``file://`` store, a pack on moto's S3), by the bypass hooks of tests/test_backends.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.store import encoding, sync
from medomni_cas.store.backend import Backend
from medomni_cas.store.bundle import export_bundle, import_bundle
from medomni_cas.store.gc import gc
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.repair import repair
from medomni_cas.store.verify import CORRUPT, MISSING, fsck
from tests import test_backends as tb
from tests._cli import medomni_here
from tests.test_backends import s3_endpoint, s3_url

__all__ = ["s3_endpoint"]  # the fixture, used by the S3 tests here

ROOT = Path(__file__).resolve().parents[1]
REF = "data/main"

Plant = Callable[[Backend, bytes, bytes], None]
HOOKS: dict[str, Plant] = {
    "lmdb": tb.TestLMDBBackend().set,
    "file": tb._DirectoryHooks().set,
    "memory": tb.TestMemoryBackend().set,
}


def urls(tmp: Path) -> dict[str, str]:
    return {"lmdb": f"lmdb://{tmp}/lmdb", "file": f"file://{tmp}/dir", "memory": "memory://"}


def fill(store: mc.Store) -> tuple[ObjectId, list[ObjectId]]:
    """A small DAG under ``REF``: leaves (one large), trees, a record; root and leaves."""
    leaves = [store.put_blob(b"leaf %d" % i) for i in range(20)]
    leaves.append(store.put_blob(os.urandom(300_000)))  # a file of its own in LMDB
    trees = [store.put_tree({f"f{j}": leaves[i + j] for j in range(7)}) for i in (0, 7, 14)]
    root = store.put_object("repair-test", 1, {"trees": trees, "big": leaves[-1]})
    store.refs.set(REF, root)
    return root, leaves


def damage(store: mc.Store, plant: Plant, oid: ObjectId) -> bytes:
    """Flip the last byte of ``oid``'s stored copy; return its good bytes."""
    good = store.get_raw(oid)
    plant(store.backend, bytes(oid), good[:-1] + bytes([good[-1] ^ 1]))
    refresh = getattr(store.backend, "refresh", None)
    if refresh is not None:  # a remote: see the pack planted around it
        refresh()
    with pytest.raises(mc.errors.IntegrityError):
        store.get_raw(oid)
    return good


def interior(store: mc.Store, root: ObjectId) -> ObjectId:
    """A tree of ``root``'s closure: it links others, so its corruption hides them."""
    return next(o for o in sorted(store.closure(root)) if store.kind(o) == "tree")


# -- put -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lmdb", "file", "memory"])
def test_put_of_the_good_bytes_replaces_a_corrupt_copy(tmp_path: Path, kind: str) -> None:
    with mc.open(urls(tmp_path)[kind]) as store:
        root, leaves = fill(store)
        for oid in (leaves[0], leaves[-1], interior(store, root)):
            good = damage(store, HOOKS[kind], oid)
            with pytest.raises(mc.errors.IntegrityError):
                gc(store, grace=0)  # as observed: gc refuses a store with a corrupt object
            assert store.put_raw(good) == oid
            assert store.get_raw(oid) == good
        assert fsck(store, jobs=1).ok
        gc(store, grace=0)


def test_put_replaces_a_corrupt_copy_on_s3(s3_endpoint: str) -> None:
    with mc.open(s3_url(s3_endpoint)) as store:
        root, leaves = fill(store)
        for oid in (leaves[0], leaves[-1], interior(store, root)):
            good = damage(store, tb.TestS3Backend().set, oid)
            store.put_raw(good)
            assert store.get_raw(oid) == good
        with mc.open(store.url) as fresh:  # another reader, with no index loaded
            assert fsck(fresh, jobs=1).ok


def test_a_record_put_again_replaces_its_corrupt_copy(tmp_path: Path) -> None:
    with mc.open(urls(tmp_path)["lmdb"]) as store:
        note = store.put_object("repair-note", 1, {"text": "hello"})
        damage(store, HOOKS["lmdb"], note)
        assert store.put_object("repair-note", 1, {"text": "hello"}) == note
        assert store.get(note).body == {"text": "hello"}


# -- import and pull -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lmdb", "file"])
def test_import_of_a_good_bundle_repairs(tmp_path: Path, kind: str) -> None:
    with mc.open(urls(tmp_path)[kind]) as store:
        root, leaves = fill(store)
        bundle = tmp_path / "good.bundle"
        export_bundle(store, [root], bundle, refs={REF: root})
        for oid in (leaves[3], leaves[-1], interior(store, root)):
            damage(store, HOOKS[kind], oid)
        import_bundle(store, bundle)
        assert fsck(store, jobs=1).ok
        gc(store, grace=0)


@pytest.mark.parametrize("kind", ["lmdb", "file"])
def test_pull_from_a_healthy_store_repairs_what_it_carries(tmp_path: Path, kind: str) -> None:
    with mc.open(f"lmdb://{tmp_path}/healthy") as healthy, mc.open(urls(tmp_path)[kind]) as dst:
        root, leaves = fill(healthy)
        sync.send(healthy, dst, [root])  # the objects, not the ref: the pull moves it
        for oid in (leaves[5], leaves[-1], interior(dst, root)):
            damage(dst, HOOKS[kind], oid)
        report = sync.pull(dst, healthy)
        assert report.objects >= 3
        assert dst.refs[REF] == root
        assert fsck(dst, jobs=1).ok


# -- fsck --repair ---------------------------------------------------------------------------
def test_repair_mends_corrupt_and_missing_objects(tmp_path: Path) -> None:
    with mc.open(f"lmdb://{tmp_path}/healthy") as healthy, mc.open(urls(tmp_path)["lmdb"]) as s:
        root, leaves = fill(healthy)
        sync.pull(s, healthy)
        tree = interior(s, root)
        damage(s, HOOKS["lmdb"], tree)  # its leaves are not checked until it is mended
        damage(s, HOOKS["lmdb"], leaves[-1])
        lost = next(leaf for leaf in leaves[:14] if leaf not in healthy.get(tree).values())
        s.backend.delete_many([bytes(lost)])
        before = fsck(s, jobs=1)
        assert {p.kind for p in before.problems} == {CORRUPT, MISSING}
        report = repair(s, healthy, jobs=1)
        assert report.ok and not report.failed and report.fetched == 3
        assert fsck(s, jobs=1).ok
        gc(s, grace=0)


def _medomni(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI in this process (a fresh one is not the point here), its output as bytes."""
    got = medomni_here(*args, cwd=ROOT)
    return subprocess.CompletedProcess(
        got.args, got.returncode, got.stdout.encode(), got.stderr.encode()
    )


def test_cas_fsck_repair(tmp_path: Path) -> None:
    healthy, damaged = f"file://{tmp_path}/healthy", f"lmdb://{tmp_path}/damaged"
    with mc.open(healthy) as h, mc.open(damaged) as d:
        root, leaves = fill(h)
        sync.pull(d, h)
        damage(d, HOOKS["lmdb"], interior(d, root))
        d.backend.delete_many([bytes(leaves[-1])])
        stranger = d.put_blob(b"only here")  # corrupt, and the healthy store lacks it
        damage(d, HOOKS["lmdb"], stranger)
    got = _medomni("cas", "fsck", "--store", damaged)
    assert got.returncode == 1
    got = _medomni("cas", "fsck", "--repair", "--from", healthy, "--store", damaged)
    out = got.stdout.decode()
    assert got.returncode == 1, out + got.stderr.decode()
    assert f"not repaired {stranger.hex()}" in out
    with mc.open(damaged) as d:
        d.backend.delete_many([bytes(stranger)])  # what only a person can decide
    got = _medomni("--json", "cas", "fsck", "--repair", "--from", healthy, "--store", damaged)
    report = json.loads(got.stdout)
    assert got.returncode == 0 and report["ok"] and report["after"]["ok"], got.stdout
    got = _medomni("cas", "fsck", "--repair", "--from", healthy, "--store", damaged)
    assert got.returncode == 0 and "nothing to repair" in got.stdout.decode()
    assert _medomni("cas", "gc", "--grace", "0", "--store", damaged).returncode == 0


def test_cas_fsck_repair_needs_a_source(tmp_path: Path) -> None:
    got = _medomni("cas", "fsck", "--repair", "--store", f"lmdb://{tmp_path}/s")
    assert got.returncode == 2 and b"--from" in got.stderr
    got = _medomni("cas", "fsck", "--from", "memory://", "--store", f"lmdb://{tmp_path}/s")
    assert got.returncode == 2 and b"--repair" in got.stderr


def test_repair_an_s3_store_from_a_local_one(s3_endpoint: str, tmp_path: Path) -> None:
    with mc.open(f"lmdb://{tmp_path}/local") as local, mc.open(s3_url(s3_endpoint)) as remote:
        root, leaves = fill(local)
        sync.push(local, remote)
        for oid in (leaves[0], interior(remote, root)):
            damage(remote, tb.TestS3Backend().set, oid)
        with mc.open(remote.url) as fresh:
            assert not fsck(fresh, jobs=1).ok
            assert repair(fresh, local, jobs=1).ok
        with mc.open(remote.url) as fresh:
            assert fsck(fresh, jobs=1).ok
            assert encoding.kind_of(fresh.get_raw(root))[0] == "repair-test"
