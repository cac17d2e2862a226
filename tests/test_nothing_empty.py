"""Nothing empty or unreachable reports ok: each case through the CLI (in this process, as
``medomni`` runs it: `tests._cli.medomni_here`).

A URL with no path, a location that holds no store (a mistyped S3 prefix, a folder), an
http store nobody serves, a damaged pack index, answer keys damaged since they were scored,
and the temp files of killed writers: each is a clear error (2 for bad input or an
unreachable store, 1 when a check finds a problem), or is cleaned.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import medomni_cas as mc
from medomni_cas.store import sync
from medomni_cas.store.backends._packs import parse_index
from medomni_cas.store.backends.fsspec import FsspecBackend
from medomni_cas.store.blobs import blob_object
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.verify import fsck
from tests._cli import medomni_here
from tests.test_backends import BUCKET, s3_endpoint  # noqa: F401 - a fixture

SET = "medomni-bench/small"
FEW = "synth-ehr_ckd-staging@n3"
NOP = "no-perception"


def one_line_error(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("medomni: error: "), proc.stderr
    for name in names:
        assert name in proc.stderr, (name, proc.stderr)


def s3(endpoint: str) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}?endpoint_url={endpoint}"


def local_store(tmp_path: Path, n: int = 8) -> tuple[str, ObjectId]:
    """An LMDB store with a tree of ``n`` small blobs under ref ``main`` (a pack on a remote)."""
    url = f"lmdb://{tmp_path}/local"
    with mc.open(url) as store:
        root = store.put_tree({f"f{i}": store.put_blob(b"blob %d" % i) for i in range(n)})
        store.refs.set("main", root)
    return url, root


def push(local: str, remote: str) -> str:
    with mc.open(local, create=False) as src, mc.open(remote) as dst:
        sync.push(src, dst)
    return remote


# -- a URL with no path --------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["lmdb", "file"])
def test_a_store_url_without_a_path_is_refused(tmp_path: Path, scheme: str) -> None:
    (tmp_path / "workspace.yaml").write_text(
        f'store: "{scheme}://"\nremotes:\n  origin: "{scheme}://?x=1"\n'
    )
    for argv in (["cas", "init"], ["cas", "put", "workspace.yaml"]):
        proc = medomni_here(*argv, cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        one_line_error(proc, "workspace.yaml", "store", f"{scheme}://")
    (tmp_path / "workspace.yaml").unlink()
    for argv in (["cas", "init"], ["cas", "fsck"]):
        proc = medomni_here("--store", f"{scheme}://", *argv, cwd=tmp_path)
        assert proc.returncode == 2
        one_line_error(proc, f"{scheme}://")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store made in the folder


def test_a_remote_url_without_a_path_is_refused_naming_its_field(tmp_path: Path) -> None:
    from medomni_cas.studio.specfile import SpecError
    from medomni_cas.workspace import Workspace

    (tmp_path / "workspace.yaml").write_text('remotes:\n  origin: "file://"\n')
    with pytest.raises(SpecError, match=r"workspace.yaml.*remotes.origin.*needs a path"):
        Workspace.load(tmp_path)


# -- a location that holds no store ----------------------------------------------------------------
def test_pull_and_fsck_of_a_mistyped_s3_prefix_say_no_store(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, root = local_store(tmp_path)
    remote = push(url, s3(s3_endpoint))
    typo = remote.replace(f"{BUCKET}/", f"{BUCKET}/x", 1)
    for argv in (["cas", "pull", typo], ["--store", typo, "cas", "fsck"]):
        proc = medomni_here("--store", f"lmdb://{tmp_path}/mine", *argv, cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.stdout)
        one_line_error(proc, f"no store at {typo}")
    fs = fsspec.filesystem("s3", endpoint_url=s3_endpoint, skip_instance_cache=True)
    assert not fs.exists(typo.split("?")[0])  # reading never made one
    with mc.open(f"lmdb://{tmp_path}/mine") as mine, mc.open(remote, create=False) as src:
        sync.pull(mine, src)  # the right prefix: a store
        assert mine.refs["main"] == root


def test_a_store_written_before_markers_still_opens(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A remote written by an older release has no marker: its folders say it is a store."""
    remote = s3(s3_endpoint)
    old = FsspecBackend(remote)  # the backend alone, as older releases wrote
    with mc.Store(old) as store:
        store.refs.set("main", store.put_blob(b"written long ago"))
    assert not old.fs.exists(old.io.path("medomni-store.json"))
    proc = medomni_here("--store", remote, "cas", "fsck", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: 1 objects, 1 refs")
    assert not old.fs.exists(old.io.path("medomni-store.json"))  # fsck wrote nothing


def test_a_new_remote_store_is_marked_and_found_while_empty(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    remote = s3(s3_endpoint)
    mc.open(remote).close()  # as `cas init` or a push makes it: marked, and empty
    proc = medomni_here("--store", remote, "cas", "fsck", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # empty, and a store
    assert proc.stdout.startswith("ok: 0 objects, 0 refs")


@pytest.mark.parametrize("scheme", ["lmdb", "file"])
def test_a_local_folder_that_holds_no_store(tmp_path: Path, scheme: str) -> None:
    (tmp_path / "folder").mkdir()
    proc = medomni_here("--store", f"{scheme}://{tmp_path}/folder", "cas", "fsck", cwd=tmp_path)
    assert proc.returncode == 2
    one_line_error(proc, "no store at")
    assert list((tmp_path / "folder").iterdir()) == []  # nothing created by reading


# -- an unreachable store -----------------------------------------------------------------------
@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port that nobody listens on (bound, so no one else takes it, never listening)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_fsck_and_pull_of_an_unreachable_http_store_exit_2(tmp_path: Path, dead_port: int) -> None:
    url = f"http://127.0.0.1:{dead_port}/store"
    for argv in (
        ["--store", url, "cas", "fsck"],
        ["--store", f"lmdb://{tmp_path}/mine", "cas", "pull", url],
    ):
        proc = medomni_here(*argv, cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        one_line_error(proc, url)
        assert "ok" not in proc.stdout


# -- a damaged pack index ------------------------------------------------------------------------
def _damage_index(remote: str) -> tuple[FsspecBackend, str, bytes]:
    backend = FsspecBackend(remote)
    backend.index.refresh()
    (name,) = backend.index.packs
    path = backend.index.pack_path(name, "idx")
    good = backend.fs.cat_file(path)
    bad = bytearray(good)
    bad[70] ^= 0x40  # a bit of the first key
    backend.fs.pipe_file(path, bytes(bad))
    return backend, path, good


def test_a_damaged_pack_index_is_rebuilt_from_its_pack(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, root = local_store(tmp_path)
    remote = push(url, s3(s3_endpoint))
    backend, path, good = _damage_index(remote)

    pulled = medomni_here("--store", f"lmdb://{tmp_path}/mine", "cas", "pull", remote, cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    with mc.open(f"lmdb://{tmp_path}/mine", create=False) as mine:
        assert mine.refs["main"] == root
        assert len(mine.closure(root)) == 9
    # the index was written again from its pack: the same entries
    again = backend.fs.cat_file(path)
    assert parse_index(again, path).keys == parse_index(good, path).keys
    checked = medomni_here("--store", remote, "cas", "fsck", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_fsck_names_a_damaged_pack_index_it_rebuilt(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = local_store(tmp_path)
    remote = push(url, s3(s3_endpoint))
    _, path, _ = _damage_index(remote)
    first = medomni_here("--store", remote, "cas", "fsck", "--json", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    report = json.loads(first.stdout)
    (problem,) = report["problems"]
    assert problem["kind"] == "damaged-file"
    assert path.rsplit("/", 1)[-1] in problem["message"] and "rebuilt" in problem["message"]
    assert report["objects"] == 9  # every object still read
    second = medomni_here("--store", remote, "cas", "fsck", cwd=tmp_path)
    assert second.returncode == 0, second.stdout  # repaired: nothing left to find


def test_a_pack_index_whose_pack_is_gone_leaves_the_rest_readable(
    s3_endpoint: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, _ = local_store(tmp_path)
    remote = push(url, s3(s3_endpoint))
    with mc.open(url) as store:  # a second pack, which stays whole
        other = store.put_tree({f"g{i}": store.put_blob(b"g%d" % i) for i in range(6)})
        store.refs.set("other", other)
    push(url, remote)
    backend = FsspecBackend(remote)
    backend.index.refresh()
    victim = backend.index.where[bytes(blob_object(b"blob 0")[0])][0]
    backend.fs.pipe_file(backend.index.pack_path(victim, "idx"), b"not an index")
    backend.fs.rm(backend.index.pack_path(victim, "pack"))
    proc = medomni_here("--store", remote, "cas", "fsck", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert "damaged-file" in {p["kind"] for p in problems}
    assert victim in " ".join(p["message"] for p in problems)
    mine = f"lmdb://{tmp_path}/mine"
    pulled = medomni_here("--store", mine, "cas", "pull", remote, "other", cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr  # the rest of the remote is readable
    with mc.open(mine, create=False) as store:
        assert store.refs["other"] == other and len(store.closure(other)) == 7


# -- answer keys damaged since they were scored ----------------------------------------------
@pytest.fixture(scope="module")
def scored_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from medomni_cas.bench.agents import find_agent
    from medomni_cas.bench.harness import run_set
    from medomni_cas.studio.tasksets import build_set
    from tests._sets import few_patients_cohort, small_tree

    root = tmp_path_factory.mktemp("scored")
    # three patients: one answer key, scored, is all the damage needs (not twenty runs)
    tree = small_tree(root, arms=[NOP], pairs=(FEW,), patients=30)
    assert few_patients_cohort(tree, 3) == FEW
    (root / "workspace.yaml").write_text("store: lmdb://store\n")
    with mc.open(f"lmdb://{root / 'store'}") as store:
        build_set(store, SET, studio=tree / "studio", bench=tree / "bench")
        run_set(
            store,
            SET,
            find_agent(tree / "bench", "baseline"),
            runs_dir=root / "runs",
            studio=tree / "studio",
        )
    return root


def test_bench_score_refuses_answer_keys_damaged_since(scored_workspace: Path) -> None:
    from medomni_cas.bench.records import Result
    from medomni_cas.bench.refnames import result_ref

    root = scored_workspace
    first = medomni_here("bench", "score", SET, "--n-boot", "20", cwd=root)
    assert first.returncode == 0, first.stderr
    with mc.open(f"lmdb://{root / 'store'}", create=False) as store:
        result = store.get(store.refs[result_ref(SET)], Result)
        (key,) = result.answer_keys
        backend = store.backend
        with backend.env.begin(write=True) as txn:  # type: ignore[attr-defined]
            value = txn.get(bytes(key), db=backend._objects)  # type: ignore[attr-defined]
            flipped = bytearray(value)
            flipped[-1] ^= 0x01
            txn.put(bytes(key), bytes(flipped), db=backend._objects)  # type: ignore[attr-defined]
    again = medomni_here("bench", "score", SET, "--n-boot", "20", cwd=root)
    assert again.returncode == 1, again.stdout + again.stderr
    one_line_error(again, key.hex(), "answer key")
    assert again.stdout == ""  # no score table printed


# -- temp files of killed writers -----------------------------------------------------------
def test_gc_sweeps_old_temp_files_of_a_file_store(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    with mc.open(url) as store:
        store.refs.set("main", store.put_blob(b"kept"))
    folder = tmp_path / "store"
    # what FileWriter and atomic_write leave when killed between write and rename
    old = [
        folder / "objects" / "ab" / ".tmp-4242-0123456789ab",
        folder / "refs" / ".tmp-4242-abcdefabcdef",
        folder / "logs" / ".tmp-4242-aaaaaaaaaaaa",
        folder / "names" / ".tmp-4242-bbbbbbbbbbbb",
    ]
    young = folder / "objects" / "cd" / ".tmp-4243-cccccccccccc"
    long_ago = time.time() - 3 * 86400
    for path in [*old, young]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half written")
    for path in old:
        os.utime(path, (long_ago, long_ago))
    proc = medomni_here("--store", url, "cas", "gc", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["orphans"] == 4
    assert [p for p in old if p.exists()] == []
    assert young.exists()  # within the grace period: a writer may be at work
    with mc.open(url, create=False) as store:
        assert fsck(store).ok
