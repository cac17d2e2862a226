"""Ref update policies: "a task set only grows", whoever moves the ref (issue 14 §1).

Every observed case runs through the CLI (`medomni cas ...`, in this process): ``ref set``
of a shrunk set, ``ref delete`` and a rebuild, ``push`` of a shrunk set to ``file://`` and
to S3 (moto on loopback), ``pull``, ``clone`` and ``import`` of a crafted record with an
extra field that links the old value. A refused update is a conflict, and exits as every
ref conflict of the CLI does (`--create` on an existing ref, a push that is not a
fast-forward): 2, with a message naming the ref, the old and new ids and why.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.cli import main
from medomni_cas.store import encoding
from medomni_cas.store.bundle import export_bundle
from medomni_cas.studio.records import PinnedPair, TaskSetRecord
from tests.test_backends import s3_endpoint, s3_url  # noqa: F401 - a fixture

REF = "tasksets/medomni-bench/v1"
SET = "medomni-bench/v1"
PAIRS = (
    "synth-ehr_ckd-staging@n20",
    "synth-ehr_ckd-staging@n50",
    "synth-ehr_hba1c-next@n20",
    "synth-ehr_hba1c-next@n50",
)


def task_set(
    pairs: tuple[str, ...] = PAIRS,
    *,
    n: int = 1,
    arms: tuple[str, ...] = ("text",),
    builder: str = "medomni-v1",
    name: str = SET,
) -> TaskSetRecord:
    return TaskSetRecord(
        name=name,
        builder=builder,
        arms=arms,
        pairs=tuple(PinnedPair(task=p, n=n) for p in sorted(pairs)),
    )


def crafted(rec: TaskSetRecord, links: mc.ObjectId) -> bytes:
    """``rec`` with an extra field, unknown to the record class, linking ``links``."""
    fields = {
        "name": rec.name,
        "builder": rec.builder,
        "arms": list(rec.arms),
        "pairs": [{"task": p.task, "n": p.n} for p in rec.pairs],
        "supersedes": links,
    }
    return encoding.encode_object(TaskSetRecord.__kind__, 1, fields)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def force_set(store: mc.Store, name: str, value: mc.ObjectId) -> None:
    """Move ``name`` as a person who means it (``force=True`` with a message). Before
    policies existed a plain set did it, which this falls back to, so that this file shows
    the observed failures on the code before the fix."""
    try:
        store.refs.set(name, value, force=True, message="test: shrink on purpose")
    except TypeError:  # no force keyword: the code before policies
        store.refs.set(name, value)


@pytest.fixture
def lmdb(tmp_path: Path) -> Iterator[tuple[str, dict[str, mc.ObjectId]]]:
    """An LMDB store whose task set ref holds the 4 pairs; the ids of a shrunk (1 pair), a
    grown (5 pairs) and a crafted set (1 pair, an extra field linking the full one)."""
    url = f"lmdb://{tmp_path}/store"
    with mc.open(url) as store:
        ids = {
            "full": store.put(task_set()),
            "shrunk": store.put(task_set(PAIRS[:1])),
            "grown": store.put(task_set((*PAIRS, "synth-ehr_egfr-slope@n20"))),
        }
        ids["crafted"] = store.put_raw(crafted(task_set(PAIRS[:1]), ids["full"]))
        store.refs.set(REF, ids["full"], message="build")
    yield url, ids


# -- cas ref set / delete --------------------------------------------------------------------------
def test_cli_ref_set_refuses_a_shrunk_set(
    capsys: pytest.CaptureFixture[str], lmdb: tuple[str, dict[str, mc.ObjectId]]
) -> None:
    url, ids = lmdb
    for bad in ("shrunk", "crafted"):
        code, _, err = run(capsys, "cas", "ref", "set", REF, ids[bad].hex(), "--store", url)
        assert code == 2, (bad, err)
        assert REF in err and ids["full"].hex() in err and ids[bad].hex() in err, err
        assert "dropped" in err and "--force" in err, err
    code, _, err = run(capsys, "cas", "ref", "set", REF, ids["grown"].hex(), "--store", url)
    assert code == 0, err
    with mc.open(url) as store:
        assert store.refs[REF] == ids["grown"]


def test_cli_ref_delete_is_refused_and_a_forced_one_recorded(
    capsys: pytest.CaptureFixture[str], lmdb: tuple[str, dict[str, mc.ObjectId]]
) -> None:
    url, ids = lmdb
    code, _, err = run(capsys, "cas", "ref", "delete", REF, "--store", url)
    assert code == 2 and "only grows" in err and REF in err, err
    code, _, err = run(capsys, "cas", "ref", "delete", REF, "--force", "--store", url)
    assert code == 2 and "needs -m" in err, err  # forcing needs a reason
    code, _, err = run(
        capsys, "cas", "ref", "delete", REF, "--force", "-m", "retire v1", "--store", url
    )
    assert code == 0, err
    # created again where a set was deleted: the new one must grow the last one
    code, _, err = run(capsys, "cas", "ref", "set", REF, ids["shrunk"].hex(), "--store", url)
    assert code == 2 and ids["full"].hex() in err and "deleted" in err, err
    with mc.open(url) as store:
        assert REF not in store.refs
        last = store.refs.history(REF)[-1]
        assert last.forced and last.message == "retire v1" and last.new is None
        # the rebuild from a shorter set file goes through the same ref
        from medomni_cas.store.policies import RefPolicyRefused
        from medomni_cas.studio.tasksets import record_task_set

        with pytest.raises(RefPolicyRefused, match="dropped"):
            record_task_set(store, task_set(PAIRS[:2]))
        assert REF not in store.refs
    code, out, err = run(capsys, "cas", "log", REF, "--store", url)
    assert code == 0 and "(forced) retire v1" in out, err


def test_cli_ref_set_force_moves_and_is_recorded(
    capsys: pytest.CaptureFixture[str], lmdb: tuple[str, dict[str, mc.ObjectId]]
) -> None:
    url, ids = lmdb
    code, _, err = run(
        capsys, "cas", "ref", "set", REF, ids["shrunk"].hex(), "--force", "--store", url
    )
    assert code == 2 and "needs -m" in err, err
    code, _, err = run(
        capsys,
        "cas",
        "ref",
        "set",
        REF,
        ids["shrunk"].hex(),
        "--force",
        "-m",
        "pairs withdrawn",
        "--store",
        url,
    )
    assert code == 0, err
    with mc.open(url) as store:
        assert store.refs[REF] == ids["shrunk"]
        entry = store.refs.history(REF)[-1]
        assert entry.forced and entry.message == "pairs withdrawn"
        assert not store.refs.history(REF)[0].forced


def test_cli_delete_then_rebuild_from_a_shorter_set_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observed sequence: `cas ref delete`, then `studio taskset build` from a set file
    with fewer pairs. The delete is refused; forced, the rebuild still must grow the set
    the history names."""
    import yaml

    from tests._sets import small_tree

    root = small_tree(tmp_path / "tree", arms=["no-perception"], name="small")
    (tmp_path / "workspace.yaml").write_text(
        f"store: lmdb://{tmp_path}/store\nstudio: {root / 'studio'}\nbench: {root / 'bench'}\n"
    )
    monkeypatch.chdir(tmp_path)
    ref = "tasksets/medomni-bench/small"
    code, _, err = run(capsys, "studio", "taskset", "build", "medomni-bench/small")
    assert code == 0, err
    code, _, err = run(capsys, "cas", "ref", "delete", ref)
    assert code == 2 and "only grows" in err, err
    code, _, err = run(capsys, "cas", "ref", "delete", ref, "--force", "-m", "start over")
    assert code == 0, err
    set_file = root / "bench/benchmarks/medomni-bench/sets/small.yaml"
    doc = yaml.safe_load(set_file.read_text())
    dropped = doc["pairs"].pop()["task"]
    set_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, _, err = run(capsys, "studio", "taskset", "build", "medomni-bench/small")
    assert code == 2 and dropped in err and "deleted" in err, err
    with mc.open(f"lmdb://{tmp_path}/store") as store:
        assert ref not in store.refs


# -- push, pull, clone -----------------------------------------------------------------------------
@pytest.fixture(params=["file", "s3"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return s3_url(request.getfixturevalue("s3_endpoint"))
    return f"file://{tmp_path}/remote"


def test_push_of_a_shrunk_set_is_refused(
    capsys: pytest.CaptureFixture[str], lmdb: tuple[str, dict[str, mc.ObjectId]], remote: str
) -> None:
    url, ids = lmdb
    code, _, err = run(capsys, "cas", "push", remote, "--store", url)
    assert code == 0, err
    with mc.open(url) as store:
        force_set(store, REF, ids["shrunk"])  # the old value is in the local history now
    code, out, err = run(capsys, "cas", "push", remote, "--store", url)
    assert code == 2, out + err
    assert REF in err and ids["full"].hex() in err and ids["shrunk"].hex() in err, err
    assert "refused" in out, out
    with mc.open(remote) as dst:
        assert dst.refs[REF] == ids["full"]
    code, _, err = run(capsys, "cas", "push", remote, "--force", "--store", url)
    assert code == 2 and "needs -m" in err, err
    code, _, err = run(capsys, "cas", "push", remote, "--force", "-m", "withdrawn", "--store", url)
    assert code == 0, err
    with mc.open(remote) as dst:
        assert dst.refs[REF] == ids["shrunk"]
        entry = dst.refs.history(REF)[-1]
        assert entry.forced and "withdrawn" in entry.message
        assert not dst.refs.check_history(REF)


def test_push_of_a_crafted_set_is_refused(
    capsys: pytest.CaptureFixture[str], lmdb: tuple[str, dict[str, mc.ObjectId]], remote: str
) -> None:
    """The crafted record links the old one, so the remote reaches it: still refused."""
    url, ids = lmdb
    assert run(capsys, "cas", "push", remote, "--store", url)[0] == 0
    with mc.open(url) as store:
        force_set(store, REF, ids["crafted"])
    code, _, err = run(capsys, "cas", "push", remote, REF, "--store", url)
    assert code == 2 and ids["crafted"].hex() in err, err
    with mc.open(remote) as dst:
        assert dst.refs[REF] == ids["full"]


def test_pull_of_a_shrunk_set_is_refused(
    capsys: pytest.CaptureFixture[str],
    lmdb: tuple[str, dict[str, mc.ObjectId]],
    remote: str,
    tmp_path: Path,
) -> None:
    url, ids = lmdb
    assert run(capsys, "cas", "push", remote, "--store", url)[0] == 0
    other = f"lmdb://{tmp_path}/other"
    assert run(capsys, "cas", "clone", remote, other)[0] == 0
    with mc.open(other) as store:
        force_set(store, REF, store.put(task_set(PAIRS[:1])))
    assert run(capsys, "cas", "push", remote, "--force", "-m", "x", "--store", other)[0] == 0
    code, out, err = run(capsys, "cas", "pull", remote, "--store", url)
    assert code == 2 and REF in err and "dropped" in err, out + err
    with mc.open(url) as store:
        assert store.refs[REF] == ids["full"]


def test_clone_into_a_store_that_retired_the_set_is_refused(
    capsys: pytest.CaptureFixture[str],
    lmdb: tuple[str, dict[str, mc.ObjectId]],
    tmp_path: Path,
) -> None:
    """A clone creates refs; where the destination's history holds a set, the created one
    must grow it."""
    url, ids = lmdb
    src = f"file://{tmp_path}/src"
    with mc.open(src) as s, mc.open(url) as store:
        s.put_raw(store.get_raw(ids["shrunk"]))
        s.refs.set(REF, ids["shrunk"])
        store.refs.delete(REF, force=True, message="retire")
    code, _, err = run(capsys, "cas", "clone", src, url)
    assert code == 2 and REF in err, err
    with mc.open(url) as store:
        assert REF not in store.refs


# -- import ---------------------------------------------------------------------------------------
def test_import_of_a_crafted_set_is_refused(
    capsys: pytest.CaptureFixture[str],
    lmdb: tuple[str, dict[str, mc.ObjectId]],
    tmp_path: Path,
) -> None:
    url, ids = lmdb
    for bad in ("crafted", "shrunk"):
        bundle = tmp_path / f"{bad}.bundle"
        with mc.open(url) as store:
            export_bundle(store, [ids[bad]], bundle, refs={REF: ids[bad]})
        code, _, err = run(capsys, "cas", "import", str(bundle), "--store", url)
        assert code == 2, (bad, err)
        assert REF in err and ids[bad].hex() in err, err
        with mc.open(url) as store:
            assert store.refs[REF] == ids["full"]


def test_import_moves_no_ref_when_one_is_refused(tmp_path: Path) -> None:
    """A bundle's refs move all or none: the policies run before the first moves."""
    with mc.open(f"lmdb://{tmp_path}/s") as store:
        full = store.put(task_set())
        store.refs.set(REF, full)
        shrunk = store.put_raw(crafted(task_set(PAIRS[:1]), full))  # a fast-forward
        other = store.put_blob(b"x")
        bundle = tmp_path / "b.bundle"
        export_bundle(store, [shrunk, other], bundle, refs={"aaa/first": other, REF: shrunk})
        from medomni_cas.store.bundle import import_bundle
        from medomni_cas.store.policies import RefPolicyRefused

        with pytest.raises(RefPolicyRefused):
            import_bundle(store, bundle)
        assert "aaa/first" not in store.refs and store.refs[REF] == full


# -- the Python API -------------------------------------------------------------------------------
def test_refs_api_refuses_and_forces(store: mc.Store) -> None:
    from medomni_cas.store.policies import RefPolicyRefused

    full, shrunk = store.put(task_set()), store.put(task_set(PAIRS[:1]))
    store.refs.set(REF, full)
    moved_n = store.put(task_set(n=2))
    other_arm = store.put(task_set(arms=("image",)))
    builder = store.put(task_set(builder="medomni-v2"))
    renamed = store.put(task_set(name="medomni-bench/v2"))
    blob = store.put_blob(b"not a set")
    for bad, why in [
        (shrunk, "dropped"),
        (moved_n, "N=2"),
        (other_arm, "arm text was dropped"),
        (builder, "builder changed"),
        (renamed, "medomni-bench/v2"),
        (blob, "not a task set record"),
    ]:
        with pytest.raises(RefPolicyRefused, match=why) as e:
            store.refs.set(REF, bad)
        assert e.value.name == REF and e.value.old == full.hex() and e.value.new == bad.hex()
        assert isinstance(e.value, mc.ConflictError)
        with pytest.raises(RefPolicyRefused):
            store.refs.set_if_equals(REF, full, bad)
        with pytest.raises(RefPolicyRefused):
            store.refs.update(REF, lambda _, bad=bad: bad)  # type: ignore[misc]
    for refused in (lambda: store.refs.delete(REF), lambda: store.refs.remove_if_equals(REF, full)):
        with pytest.raises(RefPolicyRefused, match="only grows"):
            refused()
    assert store.refs[REF] == full
    with pytest.raises(ValueError, match="message"):
        store.refs.set(REF, shrunk, force=True)  # nothing forces without saying why
    store.refs.set(REF, shrunk, force=True, message="withdrawn")
    assert store.refs.history(REF)[-1].forced


def test_policy_covers_only_the_set_refs(store: mc.Store) -> None:
    """studio/sets/ and published/ have no grow rule; a tasksets/ ref that holds no task
    set is not one; other names never load a policy."""
    full, shrunk = store.put(task_set()), store.put(task_set(PAIRS[:1]))
    for name in ("published/medomni-bench/v1", "studio/sets/medomni-bench/v1", "tasksetsx/a"):
        store.refs.set(name, full)
        store.refs.set(name, shrunk)
        store.refs.delete(name)
    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    store.refs.set("tasksets/demo/set", a)
    store.refs.set("tasksets/demo/set", b)
    store.refs.delete("tasksets/demo/set")


def test_registered_policy_runs_on_its_prefix_only(store: mc.Store) -> None:
    from medomni_cas.store.policies import RefPolicy, covered, register

    seen: list[tuple[str, mc.ObjectId | None, mc.ObjectId | None]] = []

    class NoDeletes(RefPolicy):
        def check(
            self,
            store: mc.Store,
            name: str,
            old: mc.ObjectId | None,
            new: mc.ObjectId | None,
        ) -> None:
            seen.append((name, old, new))
            if new is None:
                raise self.refuse(name, old, new, "guarded refs are never deleted")

    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    assert not covered("guarded/x")
    with register("guarded/", NoDeletes()):
        assert covered("guarded/x") and not covered("runs/slots/00")
        store.refs.set("runs/slots/00", a)
        store.refs.set("guarded/x", a)
        store.refs.set("guarded/x", b)
        with pytest.raises(mc.ConflictError, match="never deleted") as e:
            store.refs.delete("guarded/x")
        assert a.hex() not in str(e.value) and b.hex() in str(e.value)
    assert seen == [("guarded/x", None, a), ("guarded/x", a, b), ("guarded/x", b, None)]
    assert not covered("guarded/x")
    store.refs.delete("guarded/x")


def test_the_studio_policy_is_found_by_its_entry_point() -> None:
    """Found through the installed entry point, without importing the studio first."""
    from medomni_cas.store.policies import ENTRY_POINT_GROUP, covered, policies_for

    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert "tasksets" in names
    assert covered(REF) and covered("tasksets/x/y") and not covered("taskset/x")
    from medomni_cas.studio.refpolicy import TASKSETS_GROW

    assert policies_for(REF) == [TASKSETS_GROW]
    assert policies_for("published/medomni-bench/v1") == []


def test_a_name_no_policy_covers_loads_no_policy(tmp_path: Path) -> None:
    """The hot path (runs/slots/* and the like) pays one prefix check: the studio's
    policy is imported only when a tasksets/ ref moves (a fresh process shows it)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, medomni_cas as mc\n"
        "s = mc.open('memory://'); a = s.put_blob(b'a')\n"
        "s.refs.set('runs/slots/' + a.hex(), a)\n"
        "print('medomni_cas.studio.refpolicy' in sys.modules)\n"
        "s.refs.set('tasksets/demo/set', a)\n"
        "print('medomni_cas.studio.refpolicy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=os.environ.copy(),
        timeout=120,
    ).stdout
    assert out.split() == ["False", "True"]
