"""`medomni cas` output that scales: summaries by default, every line with -v or --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store with 3 named refs and 25 slot refs."""
    url = f"lmdb://{tmp_path}/store"
    with mc.open(url) as store:
        a = store.put_blob(b"a")
        for name in ("main", "tasksets/medomni-bench/v1", "results/medomni-bench/v1"):
            store.refs.set(name, a)
        for i in range(25):
            store.refs.set(f"runs/slots/{i:02}", a)
    return url


def test_refs_summarises_a_big_namespace(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, out, err = run(capsys, "cas", "refs", "--store", url)
    assert code == 0, err
    lines = out.splitlines()
    a = lines[0].split()[0]
    assert lines == [
        f"{a} main",
        f"{a} results/medomni-bench/v1",
        f"{'(25 refs)':>64} runs/slots/...",
        f"{a} tasksets/medomni-bench/v1",
        "28 refs; -v lists every one",
    ]
    code, out, _ = run(capsys, "cas", "refs", "-v", "--store", url)
    assert len(out.splitlines()) == 28 and f"{a} runs/slots/24" in out
    code, out, _ = run(capsys, "cas", "refs", "--json", "--store", url)
    assert len(json.loads(out)) == 28


def test_refs_under_a_prefix_list_what_fits(capsys: pytest.CaptureFixture[str], url: str) -> None:
    with mc.open(url) as store:
        a = store.refs["main"]
        for i in range(12):
            store.refs.set(f"studio/pairs/p{i % 3}/arm{i}", a)
    _, out, _ = run(capsys, "cas", "refs", "--store", url)
    assert f"{'(12 refs)':>64} studio/pairs/..." in out.splitlines()
    # below a prefix, namespaces are two folders deeper: the pairs, 4 refs each, all listed
    _, out, _ = run(capsys, "cas", "refs", "studio/", "--store", url)
    assert len(out.splitlines()) == 12 and "refs;" not in out
    assert out.splitlines()[0] == f"{a.hex()} studio/pairs/p0/arm0"


def test_cas_group_help_describes_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cas", "--help")
    assert code == 0
    assert "refs (names -> ids" in out
    for line in ("objects:", "refs:", "maintenance:", "bundles:", "remotes:"):
        assert any(row.startswith(line) for row in out.splitlines()), line
    for verb in ("init", "put", "fsck", "gc", "push", "pull", "clone"):
        assert f"    {verb} " in out
    code, _, err = run(capsys, "cas")  # a group without a verb shows the same help
    assert code == 2 and "maintenance:" in err
