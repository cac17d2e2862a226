"""workspace.yaml: one owner loads, checks and writes it (medomni_cas.workspace), and every
path that reads it (the CLI groups, mc.open(), the fsspec view) refuses the same bad file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

import medomni_cas as mc
from medomni_cas.cli import main
from medomni_cas.store.url import open_store as open_url
from medomni_cas.studio.specfile import SpecError
from medomni_cas.workspace import (
    DEFAULT_STORE_URL,
    Workspace,
    WorkspaceFile,
    default_store_url,
    load_workspace,
)


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "workspace.yaml").write_text(text)
    return folder


# -- reading -----------------------------------------------------------------------------------
def test_relative_file_store_is_relative_to_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "ws", "store: file://objects\n")
    monkeypatch.chdir(tmp_path)
    assert load_workspace("ws").store_url == f"file://{tmp_path.resolve()}/ws/objects"


def test_local_paths_are_relative_to_the_workspace_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write(
        tmp_path / "ws",
        "store: lmdb://./st?map_size=1\nstudio: ../shared/studio\nbench: /abs/bench\n"
        "remotes:\n  origin: file://far\n  s3: s3://b/p\n",
    )
    monkeypatch.chdir(tmp_path)
    ws = Workspace.load("ws")
    here = root.resolve()
    assert ws.root == here and ws.exists
    assert ws.store_url == f"lmdb://{here}/st?map_size=1"
    assert ws.studio == tmp_path.resolve() / "shared" / "studio"
    assert ws.bench == Path("/abs/bench")
    assert ws.runs == here / "runs"
    assert ws.remotes == {"origin": f"file://{here}/far", "s3": "s3://b/p"}


def test_no_file_or_an_empty_one_is_all_defaults(tmp_path: Path) -> None:
    bare = Workspace.load(tmp_path)
    assert not bare.exists and bare.settings == WorkspaceFile()
    assert bare.store_url == f"lmdb://{tmp_path.resolve()}/.medomni/store"
    assert (bare.studio, bare.bench, bare.runs) == tuple(
        tmp_path.resolve() / n for n in ("studio", "bench", "runs")
    )
    write(tmp_path, "# nothing set yet\n")
    assert Workspace.load(tmp_path).exists
    assert Workspace.load(tmp_path).settings == WorkspaceFile()
    assert DEFAULT_STORE_URL == "lmdb://./.medomni/store"


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("stroe: lmdb://x\n", ":1: stroe", "unknown field 'stroe' (did you mean 'store'?)"),
        ("# c\nstudio: 3\n", ":2: studio", "expected `str`, got `int`"),
        ("store: nourl\n", ":1: store", "not a store URL"),
        ("remotes:\n  origin: here\n", ":2: remotes.origin", "not a store URL"),
        ("remotes: [a]\n", ":1: remotes", "expected a mapping, got a list"),
        ("- a\n", ":1: (top level)", "expected a mapping, got a list"),
        ("store: a://\nstore: b://\n", ":2: store", "duplicate key"),
        ("store: [unclosed\n", ":2", "YAML syntax"),
    ],
)
def test_a_bad_file_names_file_line_and_field(
    tmp_path: Path, text: str, where: str, problem: str
) -> None:
    write(tmp_path, text)
    with pytest.raises(SpecError) as e:
        Workspace.load(tmp_path)
    assert str(e.value).startswith(f"{tmp_path.resolve()}/workspace.yaml{where}: ")
    assert problem in str(e.value)


BAD = "# a typo\nstroe: lmdb://x\n"
WHERE = "workspace.yaml:2: stroe: unknown field 'stroe'"


@pytest.mark.parametrize(
    "argv",
    [
        ["cas", "init"],
        ["cas", "init", "--workspace", "--store", "lmdb://./st"],
        ["cas", "refs"],
        ["cas", "push"],
        ["cas", "push", "memory://"],
        ["cas", "clone", "memory://", "lmdb://./st", "--workspace"],
        ["studio", "taskset", "show", "medomni-bench/v1"],
        ["bench", "score", "medomni-bench/v1"],
        ["plugins"],
    ],
)
def test_every_command_refuses_a_bad_file(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    write(tmp_path, BAD)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("medomni: error: ") and WHERE in err and "Traceback" not in err
    assert (tmp_path / "workspace.yaml").read_text() == BAD  # never rewritten
    assert not (tmp_path / ".medomni").exists() and not (tmp_path / "st").exists()


@pytest.mark.parametrize(
    "use",
    [
        lambda: mc.open(),
        lambda: fsspec.filesystem("medomni"),
        lambda: mc.open_workspace("."),
        lambda: default_store_url(),
    ],
    ids=["mc.open", "fsspec view", "open_workspace", "default_store_url"],
)
def test_the_library_refuses_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use: Callable[[], object]
) -> None:
    write(tmp_path, BAD)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=WHERE):
        use()
    assert not (tmp_path / ".medomni").exists()


def test_mc_open_uses_the_workspace_store_and_store_url_takes_urls_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "ws", "store: file://objects\n")
    monkeypatch.chdir(tmp_path / "ws")
    with mc.open() as store:
        oid = store.put_blob(b"x")
    assert (tmp_path / "ws" / "objects").is_dir()
    with mc.open("file://objects", create=False) as store:
        assert store.read_blob(oid) == b"x"
    with pytest.raises(TypeError):
        open_url()  # type: ignore[call-arg]  # no default: which store is the workspace's call


# -- remotes -----------------------------------------------------------------------------------
def test_remote_url(tmp_path: Path) -> None:
    ws = Workspace.load(write(tmp_path, "remotes:\n  origin: lmdb://./far\n  s3: s3://b/p\n"))
    assert ws.remote_url() == f"lmdb://{tmp_path.resolve()}/far"
    assert ws.remote_url("s3") == "s3://b/p"
    assert ws.remote_url("memory://") == "memory://"
    with pytest.raises(SpecError, match=r"workspace.yaml:1: remotes: no remote named 'nope' \("):
        ws.remote_url("nope")
    only = Workspace.load(write(tmp_path / "one", "remotes:\n  backup: s3://b/q\n"))
    assert only.remote_url() == "s3://b/q"
    two = Workspace.load(write(tmp_path / "two", "remotes:\n  a: s3://a/\n  b: s3://b/\n"))
    with pytest.raises(SpecError, match=r"name a remote \(known: a, b\) or give a URL"):
        two.remote_url()
    with pytest.raises(SpecError, match=r"workspace.yaml: remotes: no remote named 'x'"):
        Workspace.load(tmp_path / "none").remote_url("x")


# -- writing -----------------------------------------------------------------------------------
def test_set_store_creates_appends_and_refuses_another(tmp_path: Path) -> None:
    ws = Workspace.load(tmp_path).set_store("lmdb://./st")
    assert (tmp_path / "workspace.yaml").read_text() == "store: lmdb://./st\n"
    assert ws.store_url == f"lmdb://{tmp_path.resolve()}/st"
    assert ws.set_store("lmdb://st").settings.store == "lmdb://./st"  # the same store
    with pytest.raises(SpecError, match=r"workspace.yaml:1: store: already names store"):
        ws.set_store("lmdb://./other")

    write(tmp_path, "# mine\nstudio: s  # here\n")
    ws = Workspace.load(tmp_path).set_store("memory://")
    assert (
        tmp_path / "workspace.yaml"
    ).read_text() == "# mine\nstudio: s  # here\nstore: memory://\n"
    assert ws.settings == WorkspaceFile(store="memory://", studio="s")


def test_add_remote_keeps_comments_and_refuses_another_url(tmp_path: Path) -> None:
    write(tmp_path, "# mine\nstore: lmdb://st")
    ws = Workspace.load(tmp_path).add_remote("origin", "s3://b/p")
    assert (tmp_path / "workspace.yaml").read_text() == (
        "# mine\nstore: lmdb://st\nremotes:\n  origin: s3://b/p\n"
    )
    assert ws.add_remote("origin", "s3://b/p").remotes == {"origin": "s3://b/p"}
    with pytest.raises(SpecError, match=r":4: remotes.origin: already names remote 'origin'"):
        ws.add_remote("origin", "s3://b/other")
    ws = ws.add_remote("backup", "file://far")  # into the existing mapping
    assert ws.settings.remotes == {"origin": "s3://b/p", "backup": "file://far"}
    assert ws.settings.store == "lmdb://st"


def test_writing_a_key_that_is_there_but_empty(tmp_path: Path) -> None:
    write(tmp_path, "store: null\nremotes: {}\n")
    ws = Workspace.load(tmp_path).set_store("lmdb://st").add_remote("origin", "s3://b/p")
    assert ws.settings == WorkspaceFile(store="lmdb://st", remotes={"origin": "s3://b/p"})
    assert (tmp_path / "workspace.yaml").read_text().count("store:") == 1
