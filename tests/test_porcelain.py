"""The porcelain's shared rules: which folder a verb uses, how a result is named, progress."""

from __future__ import annotations

from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas import porcelain
from medomni_cas.errors import MedomniError, NotFound
from medomni_cas.porcelain import Folders, format_value, result_id
from medomni_cas.workspace import Workspace, load_workspace


def test_a_given_folder_wins_over_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "workspace.yaml").write_text("studio: s\nbench: b\n")
    folders = Folders(load_workspace(tmp_path))
    assert folders.get("studio") == tmp_path.resolve() / "s"
    assert folders.get("runs") == tmp_path.resolve() / "runs"  # the default name
    assert folders.get("bench", "elsewhere") == Path("elsewhere")
    assert folders.optional("studio", tmp_path / "x") == tmp_path / "x"
    assert folders.root == tmp_path.resolve()
    assert folders.results("medomni-bench/v1") == tmp_path.resolve() / "results/medomni-bench.v1"
    assert folders.results("medomni-bench/v1", tmp_path / "out") == tmp_path / "out"


def test_the_workspace_is_read_only_when_a_folder_is_missing(tmp_path: Path) -> None:
    loads: list[int] = []

    def load() -> Workspace:
        loads.append(1)
        return load_workspace(tmp_path)

    folders = Folders(load)
    assert folders.get("studio", "given") == Path("given") and loads == []
    assert folders.get("bench") == tmp_path.resolve() / "bench" and loads == [1]
    assert folders.get("runs") == tmp_path.resolve() / "runs" and loads == [1]  # once


def test_no_workspace_means_the_folder_must_be_given() -> None:
    folders = Folders(None, where="this workspace (memory://)")
    assert folders.optional("studio") is None and folders.root is None
    with pytest.raises(MedomniError, match=r"this workspace \(memory://\) has no bench folder"):
        folders.get("bench")
    with pytest.raises(MedomniError, match="pass out="):
        folders.results("medomni-bench/v1")
    assert folders.get("bench", "b") == Path("b")


def test_result_id_takes_a_set_name_an_id_a_prefix_or_a_ref() -> None:
    with mc.open("memory://") as store:
        rid = store.put_blob(b"a stand-in for a result")
        store.refs.set("results/medomni-bench/v1", rid)
        for spec in ("medomni-bench/v1", "results/medomni-bench/v1", rid.hex(), rid.hex()[:12]):
            assert result_id(store, spec) == rid, spec
        assert result_id(store, rid) == rid
        with pytest.raises(NotFound):
            result_id(store, "medomni-bench/v2")


def test_format_value() -> None:
    assert format_value(None) == "-" and format_value(2 / 3) == "0.667"


def test_one_bar_per_job_each_closed() -> None:
    made: list[_Bar] = []

    class _Bar:
        def __init__(self, *, total: int | None, unit: str, desc: str) -> None:
            self.n, self.total, self.unit, self.desc, self.closed = 0.0, total, unit, desc, False
            made.append(self)

        def update(self, n: float = 1) -> None:
            self.n += n

        def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    bars = porcelain._JobBars(_Bar)
    for job, done in [("s--a--arm.x--r1", 1), ("s--a--arm.x--r1", 3), ("s--a--arm.y--r1", 2)]:
        bars.update(job, done, 4)
    bars.close()
    assert [(b.desc, b.n, b.total, b.closed) for b in made] == [
        ("arm.x", 3, 4, True),
        ("arm.y", 2, 4, True),
    ]
    porcelain._JobBars(None).update("s--a--arm--r1", 1, 2)  # None: no bar at all
    assert len(made) == 2
