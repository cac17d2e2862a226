"""The `medomni` CLI, mostly in-process through `main([...])`, once as a real subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas.cli import main


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"lmdb://{tmp_path}/store"


def run(
    capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:  # exit code, stdout, stderr
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def assert_user_error(err: str, *names: str) -> None:
    assert "Traceback" not in err
    assert err.startswith("medomni: error: ")
    for name in names:
        assert name in err


def put(capsys: pytest.CaptureFixture[str], url: str, path: Path | str, *extra: str) -> str:
    return run_json(capsys, "cas", "put", str(path), "--store", url, *extra)["id"]


def make_dir(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)))
    return root


# -- init, default store, workspace --------------------------------------------------------------
def test_init_prints_url(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, out, _ = run(capsys, "cas", "init", "--store", url)
    assert code == 0
    assert out.strip() == url
    assert run_json(capsys, "cas", "init", "--store", url)["url"] == url


def test_default_store_is_dot_medomni(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_bytes(b"data")
    code, out, _ = run(capsys, "cas", "init")
    assert code == 0 and out.strip() == f"lmdb://{tmp_path.resolve()}/.medomni/store"
    oid = put(capsys, "lmdb://./.medomni/store", "f")
    assert (tmp_path / ".medomni" / "store" / "data.mdb").is_file()
    code, out, _ = run(capsys, "cas", "resolve", oid[:12])  # no --store: the same default
    assert (code, out.strip()) == (0, oid)


def test_workspace_store_is_honoured(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workspace.yaml").write_text("# mine\nstore: lmdb://elsewhere\n")
    (tmp_path / "f").write_bytes(b"data")
    code, out, err = run(capsys, "cas", "put", "f", "--ref", "main")
    assert code == 0, err
    assert (tmp_path / "elsewhere" / "data.mdb").is_file()
    assert not (tmp_path / ".medomni").exists()
    with mc.open(f"lmdb://{tmp_path}/elsewhere") as store:
        assert store.refs["main"].hex() == out.strip()


def test_init_workspace_writes_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "cas", "init", "--workspace", "--store", "lmdb://./st")
    assert code == 0, err
    assert "store: lmdb://./st" in (tmp_path / "workspace.yaml").read_text()
    assert (tmp_path / "st").is_dir()
    # again with the same store: fine; with another: refused, naming the file
    assert run(capsys, "cas", "init", "--workspace", "--store", "lmdb://./st")[0] == 0
    code, _, err = run(capsys, "cas", "init", "--workspace", "--store", "lmdb://./other")
    assert code == 2
    assert_user_error(err, "workspace.yaml")


def test_init_workspace_keeps_existing_content(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workspace.yaml").write_text("# a comment\nstudio: mine  # here")
    assert run(capsys, "cas", "init", "--workspace")[0] == 0
    text = (tmp_path / "workspace.yaml").read_text()
    assert text == "# a comment\nstudio: mine  # here\nstore: lmdb://./.medomni/store\n"


# -- put, cat, show, resolve ---------------------------------------------------------------------
def test_put_file_and_cat(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, url: str
) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"hello\x00world")
    assert main(["cas", "put", str(f), "--store", url, "--json"]) == 0
    out = json.loads(capsysbinary.readouterr().out)
    assert out["kind"] == "blob" and len(out["id"]) == 64
    assert main(["cas", "cat", out["id"][:12], "--store", url]) == 0
    assert capsysbinary.readouterr().out == b"hello\x00world"


def test_cat_streams_a_chunked_blob(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, url: str
) -> None:
    data = bytes(range(256)) * (5 * 4096 + 7)  # > 5 MiB: several chunks
    (tmp_path / "big").write_bytes(data)
    assert main(["cas", "put", str(tmp_path / "big"), "--store", url, "--ref", "big"]) == 0
    capsysbinary.readouterr()
    assert main(["cas", "cat", "big", "--store", url]) == 0
    assert capsysbinary.readouterr().out == data


def test_put_stdin_and_ref(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    out = run_json(capsys, "cas", "put", "-", "--store", url, "--ref", "in/stdin")
    assert out["ref"] == "in/stdin"
    with mc.open(url) as store:
        assert store.read_blob(store.refs["in/stdin"]) == b"from stdin"
        assert store.refs["in/stdin"].hex() == out["id"]


def test_put_ref_updates_existing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    first = put(capsys, url, tmp_path / "a", "--ref", "main")
    second = put(capsys, url, tmp_path / "b", "--ref", "main", "-m", "second")
    log = run_json(capsys, "cas", "log", "main", "--store", url)
    assert [(e["old"], e["new"]) for e in log] == [(None, first), (first, second)]
    assert log[1]["message"] == "second"
    assert log[0]["time"].endswith("+00:00")


def test_show_blob_and_record(capsys: pytest.CaptureFixture[str], url: str) -> None:
    with mc.open(url) as store:
        blob = store.put_blob(b"12345")
        manifest = store.put_blob(b"x" * (mc.store.objects.CHUNK_SIZE + 1))
    assert run_json(capsys, "cas", "show", blob.hex(), "--store", url) == {
        "id": blob.hex(),
        "kind": "blob",
        "size": 5,
    }
    shown = run_json(capsys, "cas", "show", manifest.hex(), "--store", url)
    assert shown["kind"] == "chunked-blob" and shown["id"] == manifest.hex()
    assert shown["body"]["size"] == mc.store.objects.CHUNK_SIZE + 1
    assert all(len(c) == 64 for c in shown["body"]["chunks"])  # links as hex, not base64
    code, out, _ = run(capsys, "cas", "show", blob.hex(), "--store", url)
    assert code == 0 and json.loads(out)["size"] == 5  # text mode: indented JSON


def test_show_tree_and_unknown_kind(capsys: pytest.CaptureFixture[str], url: str) -> None:
    with mc.open(url) as store:
        blob = store.put_blob(b"x")
        tree = store.put_tree({"x.txt": blob})
        other = store.put_object("x-test-thing", 3, {"link": blob, "n": 1})
    shown = run_json(capsys, "cas", "show", tree.hex(), "--store", url)
    assert shown == {
        "id": tree.hex(),
        "kind": "tree",
        "version": 1,
        "entries": {"x.txt": blob.hex()},
    }
    shown = run_json(capsys, "cas", "show", other.hex(), "--store", url)
    assert shown["kind"] == "x-test-thing" and shown["version"] == 3
    assert shown["body"] == {"link": blob.hex(), "n": 1}


def test_resolve_prefix_and_ref(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    (tmp_path / "f").write_bytes(b"f")
    oid = put(capsys, url, tmp_path / "f", "--ref", "main")
    assert run_json(capsys, "cas", "resolve", oid[:8], "--store", url) == {"id": oid}
    code, out, _ = run(capsys, "cas", "resolve", "main", "--store", url)
    assert (code, out) == (0, oid + "\n")


def test_ambiguous_prefix_exits_2_listing_candidates(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    # a real 8-hex clash needs ~65k objects; resolve only looks at keys, so plant two
    a, b = bytes.fromhex("abcdef01" + "00" * 28), bytes.fromhex("abcdef01" + "11" * 28)
    with mc.open(url) as store:
        store.backend.put_many([(a, b"x"), (b, b"y")])
    code, out, err = run(capsys, "cas", "resolve", "abcdef01", "--store", url)
    assert code == 2 and out == ""
    assert_user_error(err, "abcdef01", a.hex(), b.hex())
    code, out, err = run(capsys, "cas", "resolve", "abcdef01", "--store", url, "--json")
    assert code == 2
    assert json.loads(out)["error"]["candidates"] == [a.hex(), b.hex()]
    assert run(capsys, "cas", "cat", "abcdef01", "--store", url)[0] == 2


# -- bad input: exit 2, a message naming the culprit, no traceback -------------------------------
@pytest.mark.parametrize(
    ("argv", "culprit"),
    [
        (["cas", "cat", "0123456789abcdef"], "0123456789abcdef"),
        (["cas", "cat", "no-such-ref"], "no-such-ref"),
        (["cas", "show", "01234567" * 8], "01234567" * 8),
        (["cas", "resolve", "not a ref!"], "not a ref!"),
        (["cas", "log", "no/such/ref"], "no/such/ref"),
        (["cas", "ls", "nosuchtree"], "nosuchtree"),
        (["cas", "ref", "set", "main", "0123456789abcdef"], "0123456789abcdef"),
        (["cas", "ref", "delete", "absent"], "absent"),
        (["cas", "put", "/no/such/file"], "/no/such/file"),
        (["cas", "import", "/no/such/bundle"], "/no/such/bundle"),
        (["cas", "export", "nosuchroot", "-o", "x.bundle"], "nosuchroot"),
    ],
)
def test_bad_input_exits_2(
    capsys: pytest.CaptureFixture[str], url: str, argv: list[str], culprit: str
) -> None:
    assert run(capsys, "cas", "init", "--store", url)[0] == 0
    code, out, err = run(capsys, *argv, "--store", url)
    assert code == 2, err
    assert out == ""
    assert_user_error(err, culprit)


def test_read_commands_do_not_create_a_store(capsys: pytest.CaptureFixture[str], url: str) -> None:
    path = url.removeprefix("lmdb://")
    code, out, err = run(capsys, "cas", "refs", "--store", url)
    assert code == 2 and out == ""
    assert_user_error(err, url)
    assert not os.path.exists(path)


def test_bad_store_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "cas", "refs", "--store", "no-scheme-here")
    assert code == 2
    assert_user_error(err, "no-scheme-here")


def test_cat_of_a_tree_exits_2(capsys: pytest.CaptureFixture[str], url: str) -> None:
    with mc.open(url) as store:
        tree = store.put_tree({"x": store.put_blob(b"x")})
    code, _, err = run(capsys, "cas", "cat", tree.hex(), "--store", url)
    assert code == 2
    assert_user_error(err, tree.hex())


def test_put_bad_ref_name_stores_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    (tmp_path / "f").write_bytes(b"f")
    code, _, err = run(
        capsys, "cas", "put", str(tmp_path / "f"), "--ref", "bad..name", "--store", url
    )
    assert code == 2
    assert_user_error(err, "bad..name")
    with mc.open(url) as store:
        assert list(store.iter_ids()) == []


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["cas"]) == 2
    assert main(["cas", "nosuchverb"]) == 2
    assert main(["cas", "ref", "set", "main"]) == 2  # missing ID
    assert main(["--version"]) == 0
    capsys.readouterr()


# -- refs ---------------------------------------------------------------------------------------
def test_refs_and_ref_set_delete(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    a = put(capsys, url, tmp_path / "a", "--ref", "runs/1")
    b = put(capsys, url, tmp_path / "b", "--ref", "main")
    assert run_json(capsys, "cas", "refs", "--store", url) == {"main": b, "runs/1": a}
    assert run_json(capsys, "cas", "refs", "runs/", "--store", url) == {"runs/1": a}
    code, out, _ = run(capsys, "cas", "refs", "--store", url)
    assert out.splitlines() == [f"{b} main", f"{a} runs/1"]

    # --create refuses an existing ref; --expect must match the current value
    code, _, err = run(capsys, "cas", "ref", "set", "main", a, "--create", "--store", url)
    assert code == 2
    assert_user_error(err, "main")
    code, _, err = run(capsys, "cas", "ref", "set", "main", a[:10], "--expect", a, "--store", url)
    assert code == 2
    assert_user_error(err, "main", b)
    out = run_json(
        capsys,
        "cas",
        "ref",
        "set",
        "main",
        a[:10],
        "--expect",
        b[:10],
        "-m",
        "back",
        "--store",
        url,
    )
    assert out == {"name": "main", "old": b, "new": a}
    assert (
        run_json(capsys, "cas", "ref", "set", "new", "runs/1", "--create", "--store", url)["new"]
        == a
    )
    assert run_json(capsys, "cas", "ref", "set", "new", b, "--store", url)["old"] == a

    assert run_json(capsys, "cas", "ref", "delete", "new", "--store", url) == {
        "name": "new",
        "old": b,
    }
    assert "new" not in run_json(capsys, "cas", "refs", "--store", url)
    log = run_json(capsys, "cas", "log", "new", "--store", url)  # history outlives the ref
    assert [e["new"] for e in log] == [a, b, None]
    code, out, _ = run(capsys, "cas", "log", "main", "--store", url)
    assert code == 0
    assert out.splitlines()[-1].endswith(f"  {b}  {a}  back")


# -- trees: put DIR, ls --------------------------------------------------------------------------
def test_put_directory_and_ls(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str) -> None:
    pytest.importorskip("medomni_cas.store.trees").put_directory  # noqa: B018
    root = make_dir(tmp_path / "d")
    out = run_json(capsys, "cas", "put", str(root), "--store", url, "--ref", "tree")
    assert out["kind"] == "tree"
    rows = run_json(capsys, "cas", "ls", "tree", "--store", url)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"a.txt", "sub"}
    assert by_name["a.txt"]["kind"] == "blob" and by_name["a.txt"]["size"] == 6
    assert by_name["sub"]["kind"] == "tree"
    code, text, _ = run(capsys, "cas", "ls", out["id"][:12], "--store", url)
    assert code == 0
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"{by_name['a.txt']['id']}  a.txt")
    code, _, err = run(capsys, "cas", "ls", by_name["a.txt"]["id"], "--store", url)
    assert code == 2
    assert "Traceback" not in err


# -- fsck, gc ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["lmdb", "file"])
def test_fsck_ok_then_corrupt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scheme: str
) -> None:
    url = f"{scheme}://{tmp_path}/store"
    (tmp_path / "f").write_bytes(b"good")
    put(capsys, url, tmp_path / "f", "--ref", "main")
    report = run_json(capsys, "cas", "fsck", "--store", url)
    assert report["ok"] is True and report["objects"] == 1 and report["problems"] == []
    code, out, _ = run(capsys, "cas", "fsck", "--store", url)
    assert code == 0 and out.startswith("ok")

    # bytes stored under an id they do not hash to, behind the store's back
    bad = bytes.fromhex("ab" * 32)
    with mc.open(url) as store:
        store.backend.put_many([(bad, store.get_raw(store.refs["main"]))])
    code, out, err = run(capsys, "cas", "fsck", "--store", url, "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["ok"] is False
    assert any(p["id"] == bad.hex() for p in report["problems"])
    code, out, _ = run(capsys, "cas", "fsck", "--store", url)
    assert code == 1 and bad.hex() in out

    # reading the corrupt object is a store problem (1), not bad input
    code, _, err = run(capsys, "cas", "cat", bad.hex(), "--store", url)
    assert code == 1
    assert_user_error(err, bad.hex())


def test_gc(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc_module = pytest.importorskip("medomni_cas.store.gc")
    # gc allows a few seconds of slack on write times; run it "a minute later" instead
    later = time.time() + 60
    monkeypatch.setattr(gc_module, "time", types.SimpleNamespace(time=lambda: later))
    (tmp_path / "keep").write_bytes(b"keep")
    (tmp_path / "drop").write_bytes(b"drop")
    keep = put(capsys, url, tmp_path / "keep", "--ref", "main")
    drop = put(capsys, url, tmp_path / "drop")
    young = run_json(capsys, "cas", "gc", "--store", url)  # default grace: nothing is old
    assert young["swept"] == 0 and young["dry_run"] is False
    dry = run_json(capsys, "cas", "gc", "--grace", "0", "--dry-run", "--store", url)
    assert dry["dry_run"] is True and dry["swept_ids"] == [drop]
    code, out, _ = run(capsys, "cas", "gc", "--grace", "0", "--dry-run", "--store", url)
    assert code == 0 and drop in out and "would sweep 1" in out
    assert run_json(capsys, "cas", "resolve", drop, "--store", url) == {"id": drop}
    done = run_json(capsys, "cas", "gc", "--grace", "0", "--store", url)
    assert done["swept"] == 1 and done["swept_ids"] == [drop]
    assert run(capsys, "cas", "resolve", drop, "--store", url)[0] == 2
    assert run_json(capsys, "cas", "resolve", keep, "--store", url) == {"id": keep}


# -- export, import ------------------------------------------------------------------------------
def test_export_import_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    pytest.importorskip("medomni_cas.store.bundle")
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    (tmp_path / "c").write_bytes(b"c")
    a = put(capsys, url, tmp_path / "a", "--ref", "main")
    b = put(capsys, url, tmp_path / "b", "--ref", "other")
    c = put(capsys, url, tmp_path / "c")
    bundle = tmp_path / "out.bundle"
    info = run_json(
        capsys, "cas", "export", "main", c[:12], "--ref", "other", "-o", str(bundle), "--store", url
    )
    assert info["objects"] == 3 and bundle.is_file()
    assert info["refs"] == {"main": a, "other": b}

    dest = f"lmdb://{tmp_path}/dest"
    report = run_json(capsys, "cas", "import", str(bundle), "--store", dest)
    assert report["objects"] == 3 and report["new"] == 3
    assert run_json(capsys, "cas", "refs", "--store", dest) == {"main": a, "other": b}
    assert run_json(capsys, "cas", "fsck", "--store", dest)["ok"] is True

    fresh = f"lmdb://{tmp_path}/fresh"
    code, out, _ = run(capsys, "cas", "import", str(bundle), "--no-refs", "--store", fresh)
    assert code == 0 and "3 objects" in out
    assert run_json(capsys, "cas", "refs", "--store", fresh) == {}


def test_import_garbage_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    pytest.importorskip("medomni_cas.store.bundle")
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a bundle at all")
    code, _, err = run(capsys, "cas", "import", str(junk), "--store", url)
    assert code == 2
    assert "Traceback" not in err


# -- options anywhere, and a real process -------------------------------------------------------
def test_common_options_before_the_verb(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    (tmp_path / "f").write_bytes(b"f")
    oid = put(capsys, url, tmp_path / "f")
    code, out, _ = run(capsys, "--json", "--store", url, "cas", "resolve", oid[:8])
    assert code == 0 and json.loads(out) == {"id": oid}
    code, out, _ = run(capsys, "cas", "--store", url, "resolve", oid[:8], "--json")
    assert code == 0 and json.loads(out) == {"id": oid}


def test_subprocess(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "medomni"
    if not exe.exists():
        pytest.skip(f"console script not installed at {exe}")
    (tmp_path / "f.txt").write_text("over the wire\n")

    def medomni(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(exe), *argv], cwd=tmp_path, input=stdin, capture_output=True, timeout=60
        )

    put_ = medomni("cas", "put", "f.txt", "--ref", "main", "--json")
    assert put_.returncode == 0, put_.stderr
    oid = json.loads(put_.stdout)["id"]
    assert (tmp_path / ".medomni" / "store").is_dir()
    cat = medomni("cas", "cat", "main")
    assert (cat.returncode, cat.stdout) == (0, b"over the wire\n")
    piped = medomni("cas", "put", "-", stdin=b"piped")
    assert piped.returncode == 0 and len(piped.stdout.strip()) == 64
    missing = medomni("cas", "cat", "nothing-here")
    assert missing.returncode == 2
    assert b"nothing-here" in missing.stderr and b"Traceback" not in missing.stderr
    fsck = medomni("cas", "fsck", "--json")
    assert fsck.returncode == 0 and json.loads(fsck.stdout)["ok"] is True
    assert medomni("cas", "resolve", oid[:12]).stdout.decode().strip() == oid


@pytest.mark.parametrize(
    ("group", "description", "commands"),
    [
        (
            "studio",
            "build tasks and task sets from templates and cohorts",
            {
                "task build": "build a pair under its arms",
                "taskset build": "build a task set and record it",
                "taskset rebuild": "rebuild a published set and compare",
                "template signoff": "freeze a template",
            },
        ),
        (
            "bench",
            "run task sets with agents and score them",
            {"run": "check a task set, then run it", "score": "score the recorded runs"},
        ),
        (
            "audit",
            "provenance, verification, diff and PROV export of results",
            {
                "show": "show where a result came from",
                "verify": "re-hash a result's closure and compute its score again",
            },
        ),
        ("cas", "the content-addressed object store", {"fsck": "verify objects and refs"}),
        ("studio taskset", "task sets, <benchmark>/<set>", {"show": "show a recorded task set"}),
    ],
)
def test_group_help_describes_its_commands(
    capsys: pytest.CaptureFixture[str], group: str, description: str, commands: dict[str, str]
) -> None:
    assert main([*group.split(), "--help"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[out.splitlines().index("") + 1] == description  # under the usage
    lines = [" ".join(line.split()) for line in out.splitlines()]
    for command, help in commands.items():
        assert any(line.startswith(f"{command} {help}") for line in lines), (command, out)
