"""Refs: name rules, create-only and compare-and-swap updates, history, retrying appends."""

from __future__ import annotations

import itertools
import random
import threading

import pytest

import medomni_cas as mc
from medomni_cas.store.backends.memory import MemoryBackend
from medomni_cas.store.refs import check_ref_name, check_ref_names


@pytest.mark.parametrize(
    "name",
    ["tasksets/medomni-bench/v1", "a", "pairs/mimic-iv_ckd-staging@n20", "runs/x.y/z=1+2"],
)
def test_good_names(name: str) -> None:
    assert check_ref_name(name) == name


BAD_NAMES = [
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
]


@pytest.mark.parametrize("name", BAD_NAMES)
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


def test_get_many(store: mc.Store) -> None:
    a, b = store.put_blob(b"a"), store.put_blob(b"b")
    store.refs.add_if_new("runs/slots/00ff", a)
    store.refs.add_if_new("runs/x.y/z=1+2", b)
    names = ["runs/slots/00ff", "runs/slots/never", "runs/x.y/z=1+2", "runs/slots/00ff"]
    got = store.refs.get_many(names)
    assert got == [a, None, b, a] == [store.refs.get(n) for n in names]
    assert all(type(x) is mc.ObjectId for x in got if x is not None)
    assert store.refs.get_many([]) == []
    assert store.refs.get_many(iter(names[:2])) == [a, None]
    # a value that is not an id (written below the Refs layer) is refused, as by get
    store.backend.ref_update("runs/short", None, b"short", b"")
    for asked in (["runs/short"], ["runs/slots/00ff", "runs/short"], ["x", "runs/short"]):
        with pytest.raises(mc.InvalidId):
            store.refs.get_many(asked)
    with pytest.raises(mc.InvalidId):
        store.refs.get("runs/short")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_get_many_refuses_a_bad_name_naming_it(store: mc.Store, name: str) -> None:
    store.refs.add_if_new("runs/slots/00ff", store.put_blob(b"a"))
    for names in ([name], ["runs/slots/00ff", name, "ok"], ["x.y", name]):
        with pytest.raises(mc.InvalidName) as err:
            store.refs.get_many(names)
        assert repr(name) in str(err.value)
    with pytest.raises(mc.InvalidName, match="string"):
        store.refs.get_many(["a", 3])  # type: ignore[list-item]


def test_check_ref_names_agrees_with_check_ref_name() -> None:
    """The all-at-once check accepts exactly the lists whose every name is valid."""
    rng = random.Random(7)
    alphabet = "ab9_@+=-./ \x00é"

    def valid(name: str) -> bool:
        try:
            check_ref_name(name)
        except mc.InvalidName:
            return False
        return True

    for _ in range(3000):
        names = [
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8)))
            for _ in range(rng.randrange(1, 4))
        ]
        try:
            check_ref_names(names)
            ok = True
        except mc.InvalidName:
            ok = False
        assert ok == all(map(valid, names)), names
    check_ref_names(["x" * 1024, "a/b"])
    with pytest.raises(mc.InvalidName):
        check_ref_names(["a/b", "x" * 1025])


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
