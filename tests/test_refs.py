"""Refs: name rules, create-only and compare-and-swap updates, history, retrying appends."""

from __future__ import annotations

import itertools
import threading

import pytest

import medomni_cas as mc
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.refs import check_ref_name


@pytest.mark.parametrize(
    "name",
    ["tasksets/medomni-bench/v1", "a", "pairs/mimic-iv_ckd-staging@n20", "runs/x.y/z=1+2"],
)
def test_good_names(name: str) -> None:
    assert check_ref_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/abs",
        "a//b",
        "a/",
        "../x",
        "a/../b",
        "a/./b",
        ".hidden",
        "a/b.lock",
        "a b",
        "a\x00b",
        "a\\b",
        "x" * 1025,
        "a..b",
    ],
)
def test_bad_names_are_refused_and_nothing_written(store: mc.Store, name: str) -> None:
    oid = store.put_blob(b"x")
    with pytest.raises(mc.InvalidName):
        store.refs.add_if_new(name, oid)
    assert store.refs.as_dict() == {}
    assert store.refs.logged_names() == []


def test_non_string_name() -> None:
    with pytest.raises(mc.InvalidName, match="string"):
        check_ref_name(3)


def test_create_cas_delete_and_history(store: mc.Store) -> None:
    a, b, c = (store.put_blob(x) for x in (b"a", b"b", b"c"))
    refs = store.refs
    assert refs.add_if_new("tasksets/bench/v1", a, "create")
    assert not refs.add_if_new("tasksets/bench/v1", b)  # create-only
    assert not refs.set_if_equals("tasksets/bench/v1", b, c)  # stale expectation
    assert refs["tasksets/bench/v1"] == a
    assert refs.set_if_equals("tasksets/bench/v1", a, b, "grow")
    with pytest.raises(mc.ConflictError) as err:
        refs.set("tasksets/bench/v1", c, expected=a)
    assert err.value.current == b.hex()
    refs.set("tasksets/bench/v1", c, message="unconditional")
    refs.delete("tasksets/bench/v1", message="drop")
    assert "tasksets/bench/v1" not in refs
    with pytest.raises(mc.NotFound, match="tasksets/bench/v1"):
        refs["tasksets/bench/v1"]
    hist = refs.history("tasksets/bench/v1")
    assert [(h.old_id, h.new_id, h.message) for h in hist] == [
        (None, a, "create"),
        (a, b, "grow"),
        (b, c, "unconditional"),
        (c, None, "drop"),
    ]
    assert all(h1.time <= h2.time for h1, h2 in itertools.pairwise(hist))
    assert refs.logged_names() == ["tasksets/bench/v1"]


def test_ref_to_missing_object_is_refused(store: mc.Store) -> None:
    with pytest.raises(mc.NotFound):
        store.refs.add_if_new("x", mc.ObjectId(b"\x05" * 32))
    assert "x" not in store.refs


def test_listing_with_prefix_and_nesting(store: mc.Store) -> None:
    a = store.put_blob(b"a")
    for name in ["a", "a/b", "a/b/c", "ab", "b/a"]:
        store.refs.add_if_new(name, a)
    assert list(store.refs) == ["a", "a/b", "a/b/c", "ab", "b/a"]
    assert list(store.refs.as_dict("a/")) == ["a/b", "a/b/c"]


def test_update_retries_appends_under_contention(store: mc.Store) -> None:
    """8 threads append to one ref through update(); no append is lost."""
    refs = store.refs
    zero = store.put_object("x-counter", 1, {"n": 0, "who": []})
    refs.add_if_new("counter", zero)

    def bump(who: int) -> None:
        def fn(cur: mc.ObjectId | None) -> mc.ObjectId:
            body = store.get(cur).body
            return store.put_object(
                "x-counter", 1, {"n": body["n"] + 1, "who": [*body["who"], who]}
            )

        for _ in range(10):
            refs.update("counter", fn, f"bump {who}")

    threads = [threading.Thread(target=bump, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.get(refs["counter"]).body
    assert final["n"] == 80
    assert sorted(final["who"]) == sorted(list(range(8)) * 10)
    assert len(refs.history("counter")) == 81


def test_update_gives_up_with_conflict() -> None:
    store = mc.open("memory://")
    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    store.refs.add_if_new("r", a)

    def always_moving(cur: mc.ObjectId | None) -> mc.ObjectId:
        # someone else moves the ref every time we are about to write
        other = b if store.refs["r"] == a else a
        store.refs.set("r", other)
        return store.put_blob(b"mine")

    with pytest.raises(mc.ConflictError):
        store.refs.update("r", always_moving, attempts=3)


class NoCasBackend(MemoryBackend):
    supports_atomic_refs = False


def test_backend_without_conditional_writes_refuses_multi_writer() -> None:
    store = mc.Store(NoCasBackend())
    oid = store.put_blob(b"x")
    with pytest.raises(mc.UnsupportedOperation, match="single_writer"):
        store.refs.add_if_new("r", oid)
    single = mc.Store(store.backend, single_writer=True)
    assert single.refs.add_if_new("r", oid)
