"""Ref history is tamper-evident: a hash chain, and fsck checks every ref against it.

Observed before (issue 14 §1): a flipped bit in a ref's history, or a renamed ref, went
unnoticed by `medomni cas fsck`. Here every byte of the histories of an LMDB store (in its
``data.mdb``) and of a ``file://`` store (its ``logs/`` files) is flipped in turn, on disk,
and fsck must find each one; so must it find a renamed ref. Histories written before the
chain existed still pass, and concurrent writers keep the chain whole.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.cli import main
from medomni_cas.store.backends._layout import encode_ref_name
from medomni_cas.store.verify import fsck
from tests.test_backends import s3_endpoint, s3_url  # noqa: F401 - a fixture


def histories(store: mc.Store) -> dict[str, mc.ObjectId]:
    """Refs with a few updates each, one deleted; the objects they point at."""
    a, b, c = (store.put_blob(x) for x in (b"a", b"b", b"c"))
    store.refs.set("main", a, message="first")
    store.refs.set("main", b, message="second")
    store.refs.set("main", c, message="third")
    store.refs.set("gone", a)
    store.refs.delete("gone", message="bye")
    return {"a": a, "b": b, "c": c}


def fsck_ok(url: str) -> bool:
    with mc.open(url) as store:
        return fsck(store, jobs=1).ok


def flip(path: Path, offsets: list[int]) -> None:
    """Flip one bit of the byte at each offset of ``path``, in place (an open LMDB map
    sees it at once, as it would a flip on the disk)."""
    with open(path, "r+b") as f:
        for at in offsets:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << (at % 8))]))


def copies(path: Path, needle: bytes) -> list[int]:
    """Where ``needle`` sits in ``path``: LMDB keeps old copies of pages in its file, and
    the one a reader sees is among them, so a flip goes to every copy."""
    data = path.read_bytes()
    out, start = [], 0
    while (i := data.find(needle, start)) >= 0:
        out.append(i)
        start = i + 1
    return out


def all_flips_found(store: mc.Store, path: Path, spans: list[list[int]]) -> tuple[int, list[int]]:
    """Flip each byte of each span (the offsets of one byte's copies) in turn, run fsck,
    flip it back; return how many flips were made and the spans' bytes fsck missed."""
    missed = []
    for n, offsets in enumerate(spans):
        flip(path, offsets)
        try:
            if fsck(store, jobs=1).ok:
                missed.append(n)
        finally:
            flip(path, offsets)
    return len(spans), missed


def test_every_flipped_bit_in_an_lmdb_history_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"lmdb://{tmp_path}/s"
    data_file = tmp_path / "s" / "data.mdb"
    with mc.open(url) as store:
        histories(store)
        entries = [*store.backend.ref_log("main"), *store.backend.ref_log("gone")]
        assert fsck(store, jobs=1).ok
        spans = []
        for entry in entries:
            where = copies(data_file, entry)
            assert where
            spans += [[i + at for i in where] for at in range(len(entry))]
        flips, missed = all_flips_found(store, data_file, spans)
        assert fsck(store, jobs=1).ok
    assert flips > 400 and missed == [], f"{len(missed)} of {flips} flips missed"
    # through the CLI: exit 1, naming the ref
    flip(data_file, [i + len(entries[1]) - 3 for i in copies(data_file, entries[1])])
    code, out, _ = main(["cas", "fsck", "--store", url]), *capsys.readouterr()
    assert code == 1 and "ref-history main" in out, out


def test_every_flipped_bit_in_a_file_history_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path}/s"
    with mc.open(url) as store:
        histories(store)
        assert fsck(store, jobs=1).ok
        flips, missed = 0, []
        for name in ("main", "gone"):
            log = tmp_path / "s" / "logs" / encode_ref_name(name)
            size = log.stat().st_size
            n, bad = all_flips_found(store, log, [[at] for at in range(size)])
            flips += n
            missed += [(name, at) for at in bad]
    assert flips > 400 and missed == [], f"{len(missed)} of {flips} flips missed: {missed[:10]}"
    flip(tmp_path / "s" / "logs" / "main", [40])
    code, out, _ = main(["cas", "fsck", "--store", url]), *capsys.readouterr()
    assert code == 1 and "ref-history main" in out, out


def test_a_renamed_ref_is_found(tmp_path: Path) -> None:
    # file://: the ref file alone, or the ref file and its history together
    url = f"file://{tmp_path}/d"
    with mc.open(url) as store:
        histories(store)
    root = tmp_path / "d"
    (root / "refs" / "main").rename(root / "refs" / "moved")
    assert not fsck_ok(url)
    (root / "logs" / "main").rename(root / "logs" / "moved")
    with mc.open(url) as store:
        assert store.refs.get("moved") is not None
        assert any("hash chain" in p for p in store.refs.check_history("moved"))
        assert not fsck(store, jobs=1).ok
    # LMDB: a ref's key changed (its history stays under the old name)
    url = f"lmdb://{tmp_path}/l"
    with mc.open(url) as store:
        histories(store)
    data_file = tmp_path / "l" / "data.mdb"
    raw = data_file.read_bytes()
    # the key "main" of the refs table: 4 bytes, found with its 32-byte value after it
    with mc.open(url) as store:
        value = bytes(store.refs["main"])
    assert raw.count(b"main" + value) >= 1
    data_file.write_bytes(raw.replace(b"main" + value, b"mair" + value))
    with mc.open(url) as store:
        assert store.refs.get("mair") is not None and "main" not in store.refs
        report = fsck(store, jobs=1)
    assert not report.ok
    assert {p.id for p in report.problems} == {"main", "mair"}, report.problems


def test_histories_from_before_the_chain_pass(store: mc.Store) -> None:
    """Entries without a link keep their bytes and pass; the chain starts at the first
    linked entry, and an unlinked entry after it is a problem."""
    from medomni_cas.store.reflog import RefLogEntry, encode_entry

    a, b, c = (store.put_blob(x) for x in (b"a", b"b", b"c"))
    old = [
        RefLogEntry(old=None, new=bytes(a), time=1.0),
        RefLogEntry(old=bytes(a), new=bytes(b), time=2.0),
    ]
    assert encode_entry(old[0]) == b"\x82\xa3new\xc4\x20" + a + b"\xa4time\xcb?\xf0" + bytes(6)
    assert store.backend.ref_update("legacy", None, a, encode_entry(old[0]))
    assert store.backend.ref_update("legacy", a, b, encode_entry(old[1]))
    assert store.backend.ref_update("only-legacy", None, a, encode_entry(old[0]))
    assert fsck(store, jobs=1).ok
    store.refs.set("legacy", c)
    store.refs.set("legacy", a)
    assert store.refs.check_history("legacy") == []
    assert fsck(store, jobs=1).ok
    # an unlinked entry after a linked one: a forged (or downgraded) entry
    forged = RefLogEntry(old=bytes(a), new=bytes(b), time=3.0)
    assert store.backend.ref_update("legacy", a, b, encode_entry(forged))
    problems = store.refs.check_history("legacy")
    assert len(problems) == 1 and "no link" in problems[0], problems


def test_forced_updates_are_in_the_chain(store: mc.Store) -> None:
    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    store.refs.set("x", a)
    store.refs.set("x", b, force=True, message="why")
    last = store.refs.history("x")[-1]
    assert last.forced and last.message == "why" and last.chain is not None
    assert store.refs.check_history("x") == []


@pytest.fixture(params=["memory", "lmdb", "file", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[mc.Store]:
    if request.param == "s3":
        url = s3_url(request.getfixturevalue("s3_endpoint"))
    else:
        url = {
            "memory": "memory://",
            "lmdb": f"lmdb://{tmp_path}/l",
            "file": f"file://{tmp_path}/d",
        }[request.param]
    with mc.open(url) as store:
        yield store


def test_concurrent_writers_keep_the_chain_whole(any_store: mc.Store) -> None:
    """Each entry links its predecessor inside the backend's atomic step: writers racing
    on one ref never link the same entry twice."""
    store = any_store
    values = [store.put_blob(b"%d" % i) for i in range(8)]
    rounds = 4 if store.url.startswith("s3://") else 20

    def writer(k: int) -> None:
        for i in range(rounds):
            value = values[(k + i) % len(values)]
            store.refs.update("counter", lambda _cur, value=value: value)  # type: ignore[misc]

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = store.refs.history("counter")
    assert len(entries) >= rounds  # some writes repeat the current value and are skipped
    assert all(e.chain is not None for e in entries)
    assert store.refs.check_history("counter") == []
    assert fsck(store, jobs=1).ok
