"""A conformance suite for `Backend` implementations, in the style of zarr's ``StoreTests``.

Use
---
A backend's test module subclasses `BackendTests` and says how to make a fresh, empty
backend, either by overriding `BackendTests.make_backend` or the ``backend`` fixture::

    from medomni_cas.testing import BackendTests

    class TestMyBackend(BackendTests):
        def make_backend(self, tmp_path):
            return MyBackend(tmp_path / "store")

Every test talks to the backend only through the `Backend` interface, so a new backend
gets the whole contract checked for free.

Bypass hooks
------------
A few tests need to put the storage in a state the interface cannot make: an object
written long ago, an object whose bytes do not match its id, what a killed writer leaves.
They use hooks that reach around the backend, as zarr's ``set``/``get`` do:
`BackendTests.set`, `BackendTests.get` and `BackendTests.orphans`. The tests that need
``set``/``get`` are skipped until a subclass defines them.

Without pytest
--------------
Importing this module does not import pytest (a backend's package may ship it without
depending on pytest); pytest is imported when a subclass is made, which happens in a test
module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import blake3

from medomni_cas.errors import IntegrityError, UnsupportedOperation
from medomni_cas.store.backend import FRESHEN_AFTER, Backend
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

__all__ = ["BackendTests", "counter_key", "increment"]


def key(data: bytes) -> bytes:
    """The id a store would give ``data`` (the backend does not care, but it looks real)."""
    return blake3.blake3(data).digest()


def counter_key(n: int) -> bytes:
    """The id of the counter value ``n`` stored by `increment`."""
    return key(b"%d" % n)


def increment(backend: Backend, ref: str, times: int) -> int:
    """Add 1 to the counter under ``ref`` ``times`` times by compare-and-swap; return lost races.

    The counter's value n is stored as the object ``b"%d" % n``. Used by the thread test here
    and by multi-process tests, which run it in each process.
    """
    lost = 0
    done = 0
    while done < times:
        old = backend.ref_get(ref)
        n = 0 if old is None else int(backend.get(old))
        data = b"%d" % (n + 1)
        new = key(data)
        backend.put_many([(new, data)])
        if backend.ref_update(ref, old, new, b"%d->%d" % (n, n + 1)):
            done += 1
        else:
            lost += 1
    return lost


def _pytest() -> Any:
    import pytest  # here, not at import time: see the module docstring

    return pytest


def _skip(reason: str) -> NoReturn:
    """``pytest.skip``, typed as what it is: it raises (``_pytest`` is typed Any)."""
    _pytest().skip(reason)
    raise AssertionError("pytest.skip returned")  # never reached: skip raises


def _deletes(backend: Backend) -> None:
    if not backend.supports_deletes:
        _skip(f"{backend!r} does not delete objects")


def _backend_fixture(self: BackendTests, tmp_path: Path) -> Iterator[Backend]:
    b = self.make_backend(tmp_path)
    yield b
    b.close()


class BackendTests:
    """The contract of `Backend`. Subclass, and supply `make_backend` or a ``backend`` fixture."""

    #: How many objects `test_many_objects` puts in one batch.
    many: int = 2000

    #: The fixture each test takes: a subclass's own, else the default set below.
    backend: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "backend"):
            # the default fixture, made here so that importing this module needs no pytest
            cls.backend = _pytest().fixture(_backend_fixture, name="backend")

    def make_backend(self, tmp_path: Path) -> Backend:
        """A fresh, empty backend."""
        raise NotImplementedError(f"{type(self).__name__} must define make_backend")

    # -- bypass hooks ----------------------------------------------------------------------
    def set(self, backend: Backend, key: bytes, data: bytes, *, stamp: float | None = None) -> None:
        """Store ``data`` under ``key`` around ``backend`` (not through its methods), as if
        written at ``stamp`` (epoch seconds; None: now). ``data`` need not hash to ``key``."""
        _skip(f"{type(self).__name__} defines no bypass hook `set`")

    def get(self, backend: Backend, key: bytes) -> bytes | None:
        """The bytes stored under ``key``, read around ``backend``; None when absent."""
        _skip(f"{type(self).__name__} defines no bypass hook `get`")

    def orphans(self, backend: Backend) -> int:
        """Leave in ``backend``'s storage what killed writers leave behind (files that are
        no object), written before now; return how many `Backend.remove_orphans` must
        remove. The default leaves nothing, for backends that never leave leftovers."""
        return 0

    # -- objects -------------------------------------------------------------------------------
    def test_put_get_round_trip(self, backend: Backend) -> None:
        data = b"hello \x00 world"
        assert backend.put_many([(key(data), data)]) == 1
        assert backend.get(key(data)) == data

    def test_put_is_put_if_absent(self, backend: Backend) -> None:
        k = key(b"one")
        assert backend.put(k, b"one") is True
        # a second put of the same id is a no-op: 0 new, bytes unchanged
        assert backend.put_many([(k, b"something else")]) == 0
        assert backend.put(k, b"one") is False
        assert backend.get(k) == b"one"

    def test_put_many_counts_duplicates_once(self, backend: Backend) -> None:
        k = key(b"dup")
        assert backend.put_many([(k, b"dup"), (k, b"dup")]) == 1
        assert list(backend.iter_keys()) == [k]

    def test_get_absent_raises_key_error(self, backend: Backend) -> None:
        with _pytest().raises(KeyError):
            backend.get(key(b"absent"))

    def test_get_many_keeps_order_and_marks_absent(self, backend: Backend) -> None:
        a, b, c = key(b"a"), key(b"b"), key(b"c")
        backend.put_many([(a, b"a"), (c, b"c")])
        assert list(backend.get_many([c, b, a, c])) == [(c, b"c"), (b, None), (a, b"a"), (c, b"c")]
        assert list(backend.get_many([])) == []

    def test_missing_and_contains(self, backend: Backend) -> None:
        present = [key(b"%d" % i) for i in range(5)]
        absent = [key(b"x%d" % i) for i in range(5)]
        backend.put_many((k, b"") for k in present)
        asked = [absent[0], present[0], absent[1], present[1]]
        assert backend.missing(asked) == [absent[0], absent[1]]
        assert backend.contains(present[3])
        assert not backend.contains(absent[3])

    def test_missing_many(self, backend: Backend) -> None:
        # enough ids that a backend choosing between per-key and listing checks lists
        present = [key(b"%d" % i) for i in range(300)]
        absent = [key(b"x%d" % i) for i in range(300)]
        backend.put_many((k, b"v") for k in present)
        asked = [k for pair in zip(absent, present, strict=True) for k in pair]
        assert backend.missing(asked) == absent

    def test_empty_value(self, backend: Backend) -> None:
        k = key(b"")
        assert backend.put(k, b"")
        assert backend.get(k) == b""
        assert list(backend.get_many([k])) == [(k, b"")]
        assert backend.contains(k)

    def test_iter_keys_prefixes(self, backend: Backend) -> None:
        keys = [key(b"%d" % i) for i in range(200)]
        backend.put_many((k, b"v") for k in keys)
        assert sorted(backend.iter_keys()) == sorted(keys)
        target = keys[17].hex()
        for n in (1, 2, 3, 4, 9, 64):  # odd and even lengths: half bytes matter
            prefix = target[:n]
            expected = sorted(k for k in keys if k.hex().startswith(prefix))
            assert sorted(backend.iter_keys(prefix)) == expected, prefix
        assert list(backend.iter_keys("f" * 12)) == []

    def test_iter_stamps(self, backend: Backend) -> None:
        before = time.time()
        keys = [key(b"%d" % i) for i in range(10)]
        backend.put_many((k, b"v") for k in keys)
        stamps = dict(backend.iter_stamps())
        assert sorted(stamps) == sorted(keys)
        # coarse clocks (S3 seconds, filesystem mtimes) may round down a little
        assert all(before - 2 <= t <= time.time() + 2 for t in stamps.values())

    def test_delete_many(self, backend: Backend) -> None:
        _deletes(backend)
        keys = [key(b"%d" % i) for i in range(6)]
        backend.put_many((k, b"v") for k in keys)
        assert backend.delete_many([keys[0], keys[1], key(b"never")]) == 2
        assert backend.delete_many([keys[0]]) == 0
        assert sorted(backend.iter_keys()) == sorted(keys[2:])
        with _pytest().raises(KeyError):
            backend.get(keys[0])
        # a deleted object can be put again
        assert backend.put(keys[0], b"v")

    def test_many_objects(self, backend: Backend) -> None:
        items = [(key(b"many%d" % i), b"value %d" % i) for i in range(self.many)]
        assert backend.put_many(items) == self.many
        assert backend.put_many(items[: self.many // 2]) == 0
        assert backend.missing(k for k, _ in items) == []
        got = dict(backend.get_many(k for k, _ in items))
        assert got == dict(items)
        assert len(list(backend.iter_keys())) == self.many

    def test_get_list_keeps_order_and_marks_absent(self, backend: Backend) -> None:
        a, b, c, e = key(b"a"), key(b"b"), key(b"c"), key(b"")
        backend.put_many([(a, b"a"), (c, b"c"), (e, b"")])
        assert backend.get_list([c, b, a, c, e]) == [b"c", None, b"a", b"c", b""]
        assert backend.get_list([]) == []
        assert backend.get_list([b]) == [None]
        assert backend.get_list((a,)) == [b"a"]  # any sequence

    def test_get_parts_read_all_in_order_within_the_bound(self, backend: Backend) -> None:
        small = [(key(b"part%d" % i), b"s%d" % i) for i in range(40)]
        large = [(key(b"large%d" % i), bytes([i]) * 300_000) for i in range(12)]
        items = [x for pair in zip(small, large + small[12:], strict=False) for x in pair]
        backend.put_many(items[::3])
        keys = [k for k, _ in items] + [items[0][0]]  # absent ones, and a repeat
        parts = list(backend.get_parts(keys, 1 << 20))
        assert [k for ks, _ in parts for k in ks] == keys
        assert [d for _, got in parts for d in got] == backend.get_list(keys)
        assert all(len(ks) == len(got) and ks for ks, got in parts)
        assert max(sum(len(d) for d in got if d) for _, got in parts) <= 2 << 20
        assert list(backend.get_parts([], 1 << 20)) == []

    def test_iter_parts_reads_every_object_once_within_the_bounds(self, backend: Backend) -> None:
        """A pass over the store (fsck's): every key listed, with its bytes, once, in the
        listing's order; parts of at most ``size`` keys, about ``held_bytes`` of bytes."""
        small = [(key(b"pass%d" % i), b"s%d" % i) for i in range(50)]
        large = [(key(b"pass-large%d" % i), bytes([i]) * 300_000) for i in range(8)]
        backend.put_many([*small, *large, (key(b""), b"")])
        parts = list(backend.iter_parts(1 << 20, size=7))
        keys = [k for ks, _ in parts for k in ks]
        assert keys == list(backend.iter_keys())
        assert len(keys) == len(set(keys)) == 59
        assert [d for _, got in parts for d in got] == backend.get_list(keys)
        assert all(0 < len(ks) == len(got) <= 7 for ks, got in parts)
        assert max(sum(len(d) for d in got if d) for _, got in parts) <= 2 << 20

    def test_iter_parts_of_an_empty_store(self, backend: Backend) -> None:
        assert list(backend.iter_parts(1 << 20)) == []

    def test_iter_stamped_parts_gives_each_object_its_write_time(self, backend: Backend) -> None:
        """gc's pass: `iter_parts` with the times `iter_stamps` gives, each key once."""
        small = [(key(b"stamped%d" % i), b"t%d" % i) for i in range(40)]
        large = [(key(b"stamped-large%d" % i), bytes([i]) * 300_000) for i in range(5)]
        backend.put_many([*small, *large])
        parts = list(backend.iter_stamped_parts(1 << 20, size=6))
        keys = [k for ks, _, _ in parts for k in ks]
        assert sorted(keys) == sorted(backend.iter_keys())
        assert len(keys) == len(set(keys)) == 45
        assert [d for _, got, _ in parts for d in got] == backend.get_list(keys)
        assert all(0 < len(ks) == len(got) == len(when) <= 6 for ks, got, when in parts)
        stamps = dict(backend.iter_stamps())
        assert {k: t for ks, _, when in parts for k, t in zip(ks, when, strict=True)} == stamps

    def test_a_backend_that_lists_in_key_order_does(self, backend: Backend) -> None:
        """gc marks from one pass only where the listing says it is in key order."""
        if not backend.lists_in_key_order:
            _skip(f"{backend!r} does not list in key order")
        backend.put_many([(key(b"ordered%d" % i), b"o%d" % i) for i in range(300)])
        listed = list(backend.iter_keys())
        assert listed == sorted(listed) and len(listed) == 300
        assert [k for k, _ in backend.iter_stamps()] == listed
        assert [k for ks, _, _ in backend.iter_stamped_parts(1 << 20, size=7) for k in ks] == listed

    def test_iter_stamped_parts_of_an_empty_store(self, backend: Backend) -> None:
        assert list(backend.iter_stamped_parts(1 << 20)) == []

    def test_batch_reads_agree(self, backend: Backend) -> None:
        items = [(key(b"batch%d" % i), b"value %d" % i) for i in range(300)]
        backend.put_many(items[::2])
        keys = [k for k, _ in items] + [items[0][0]]  # absent ones, and a repeat
        expected = [backend.get(k) if backend.contains(k) else None for k in keys]
        assert expected[::2][:3] == [b"value 0", b"value 2", b"value 4"]
        assert [data for _, data in backend.get_many(keys)] == expected
        assert [k for k, _ in backend.get_many(keys)] == keys
        assert backend.get_list(keys) == expected

    # -- deleting (gc's contract) ------------------------------------------------------------
    def test_delete_unsupported(self, backend: Backend) -> None:
        if backend.supports_deletes:
            _skip(f"{backend!r} deletes")
        k = key(b"kept")
        backend.put(k, b"kept")
        with _pytest().raises(UnsupportedOperation):
            backend.delete_many([k])
        assert backend.get(k) == b"kept"

    def test_delete_older_than_keeps_what_is_not_older(self, backend: Backend) -> None:
        _deletes(backend)
        keys = [key(b"t%d" % i) for i in range(6)]
        backend.put_many((k, b"v") for k in keys)
        stamps = dict(backend.iter_stamps())
        # gc passes its cutoff: a key written at or after it may have been put again since
        # gc listed it, and is kept
        assert backend.delete_many(keys, older_than=min(stamps.values()) - 0.001) == 0
        assert backend.missing(keys) == []
        assert backend.delete_many(keys[:2], older_than=max(stamps.values()) + 1) == 2
        assert backend.missing(keys) == keys[:2]

    def test_delete_older_than_of_old_objects(self, backend: Backend) -> None:
        _deletes(backend)
        now = time.time()
        old, fresh = key(b"old"), key(b"fresh")
        self.set(backend, old, b"old", stamp=now - 7200)
        backend.put(fresh, b"fresh")
        assert backend.delete_many([old, fresh], older_than=now - 60) == 1
        assert backend.missing([old, fresh]) == [old]
        assert self.get(backend, old) is None
        assert self.get(backend, fresh) == b"fresh"

    def test_put_again_refreshes_an_old_object(self, backend: Backend) -> None:
        """gc's grace counts from the write time: an object put again (a writer about to
        link to it) must not be swept as old."""
        _deletes(backend)
        k = key(b"again")
        self.set(backend, k, b"again", stamp=time.time() - 2 * FRESHEN_AFTER)
        assert backend.put_many([(k, b"again")]) == 0
        assert backend.delete_many([k], older_than=time.time() - 60) == 0
        assert backend.get(k) == b"again"

    def test_remove_orphans(self, backend: Backend) -> None:
        items = [(key(b"o%d" % i), b"v%d" % i) for i in range(10)]
        big = b"x" * (300 * 1024)  # large enough to be a file of its own where that applies
        items.append((key(big), big))
        backend.put_many(items)
        planted = self.orphans(backend)
        assert backend.remove_orphans(time.time() + 10) == planted
        assert backend.remove_orphans(time.time() + 10) == 0
        assert backend.get_list([k for k, _ in items]) == [d for _, d in items]

    # -- the bypass hooks ----------------------------------------------------------------------
    def test_bypass_get_reads_what_was_put(self, backend: Backend) -> None:
        k = key(b"put")
        backend.put(k, b"put")
        assert self.get(backend, k) == b"put"
        assert self.get(backend, key(b"absent")) is None

    def test_object_set_around_the_backend_is_read(self, backend: Backend) -> None:
        k = key(b"planted")
        self.set(backend, k, b"planted")
        assert backend.get(k) == b"planted"
        assert backend.get_list([k]) == [b"planted"]
        assert list(backend.get_many([k])) == [(k, b"planted")]
        assert backend.missing([k]) == []
        assert backend.contains(k)
        assert list(backend.iter_keys(k.hex()[:3])) == [k]

    def test_corrupt_object_is_refused_by_the_store(self, backend: Backend) -> None:
        k = key(b"genuine")
        self.set(backend, k, b"tampered")
        with _pytest().raises(IntegrityError):
            Store(backend).get_raw(ObjectId(k))

    def test_put_replaces_a_corrupt_copy(self, backend: Backend) -> None:
        cases = [
            (data, bad)
            for n, size in enumerate((7, 300_000))  # inline and large, packed and loose
            for data in [bytes([65 + n]) * size]
            for bad in (data[:-1] + b"!", data[:-1])  # a changed byte, a lost byte
        ]
        for i, (data, bad) in enumerate(cases):
            data, bad = bytes([i]) + data, bytes([i]) + bad  # a key of its own for each
            k = key(data)
            self.set(backend, k, bad)
            with _pytest().raises(IntegrityError):
                Store(backend).get_raw(ObjectId(k))
            backend.put_many([(k, data)])
            assert self.get(backend, k) == data
            assert Store(backend).get_raw(ObjectId(k)) == data

    def test_put_replaces_corrupt_copies_in_a_batch(self, backend: Backend) -> None:
        items = [(key(b"%d" % i), b"%d" % i) for i in range(8)]
        backend.put_many(items[:4])
        for k, d in items[:2]:
            self.set(backend, k, d + b"?")
        assert backend.put_many(items) == 4
        assert backend.get_list([k for k, _ in items]) == [d for _, d in items]

    # -- refs ----------------------------------------------------------------------------------
    def test_ref_create_only(self, backend: Backend) -> None:
        a, b = key(b"a"), key(b"b")
        assert backend.ref_get("main") is None
        assert backend.ref_update("main", None, a, b"create")
        assert backend.ref_get("main") == a
        # creating again (old=None) loses: the ref exists
        assert not backend.ref_update("main", None, b, b"create again")
        assert backend.ref_get("main") == a

    def test_ref_compare_and_swap(self, backend: Backend) -> None:
        a, b, c = key(b"a"), key(b"b"), key(b"c")
        backend.ref_update("r", None, a, b"1")
        assert backend.ref_update("r", a, b, b"2")
        assert backend.ref_get("r") == b
        assert not backend.ref_update("r", a, c, b"stale")  # a lost race is an answer
        assert backend.ref_get("r") == b
        assert backend.ref_log("r") == [b"1", b"2"]

    def test_ref_delete(self, backend: Backend) -> None:
        a, b = key(b"a"), key(b"b")
        backend.ref_update("gone", None, a, b"1")
        assert not backend.ref_update("gone", b, None, b"wrong old")
        assert backend.ref_update("gone", a, None, b"2")
        assert backend.ref_get("gone") is None
        assert list(backend.ref_iter()) == []
        assert not backend.ref_update("gone", a, None, b"again")
        # a deleted ref can be created again, and its history goes on
        assert backend.ref_update("gone", None, b, b"3")
        assert backend.ref_get("gone") == b
        assert backend.ref_log("gone") == [b"1", b"2", b"3"]

    def test_ref_iter_prefix_and_nesting(self, backend: Backend) -> None:
        a, b, c = key(b"a"), key(b"b"), key(b"c")
        backend.ref_update("a", None, a, b"")
        backend.ref_update("a/b", None, b, b"")  # a ref and a "folder" of the same name
        backend.ref_update("tasksets/x/set-1", None, c, b"")
        backend.ref_update("tasksets/y", None, a, b"")
        assert backend.ref_get("a") == a
        assert backend.ref_get("a/b") == b
        assert list(backend.ref_iter()) == [
            ("a", a),
            ("a/b", b),
            ("tasksets/x/set-1", c),
            ("tasksets/y", a),
        ]
        assert list(backend.ref_iter("tasksets/")) == [("tasksets/x/set-1", c), ("tasksets/y", a)]
        assert list(backend.ref_iter("a/")) == [("a/b", b)]
        assert list(backend.ref_iter("nothing")) == []

    def test_ref_names_with_odd_characters(self, backend: Backend) -> None:
        a = key(b"a")
        names = ["x@1+2=3", "Upper/lower", "a_b-c.d", "tasksets/b/set-1"]
        for name in names:
            assert backend.ref_update(name, None, a, name.encode())
        assert sorted(n for n, _ in backend.ref_iter()) == sorted(names)
        for name in names:
            assert backend.ref_log(name) == [name.encode()]

    def test_ref_long_name(self, backend: Backend) -> None:
        name = "/".join(["component-" + "x" * 40] * 6)  # too long for one file name
        a = key(b"a")
        assert backend.ref_update(name, None, a, b"long")
        assert backend.ref_get(name) == a
        assert list(backend.ref_iter()) == [(name, a)]
        assert backend.ref_log(name) == [b"long"]
        assert list(backend.ref_log_names()) == [name]

    def test_ref_log_order_and_kept_after_delete(self, backend: Backend) -> None:
        values = [key(b"%d" % i) for i in range(5)]
        old = None
        for i, v in enumerate(values):
            assert backend.ref_update("logged", old, v, b"entry %d" % i)
            old = v
        assert backend.ref_update("logged", old, None, b"deleted")
        assert backend.ref_log("logged") == [b"entry %d" % i for i in range(5)] + [b"deleted"]
        assert backend.ref_log("never") == []

    def test_ref_log_entry_made_from_the_previous_one(self, backend: Backend) -> None:
        """An entry given as a function gets the previous entry's bytes (None for the
        first; across a delete too), inside the atomic step: the history's hash chain."""
        seen: list[bytes | None] = []

        def entry(label: bytes) -> Callable[[bytes | None], bytes]:
            def make(previous: bytes | None) -> bytes:
                seen.append(previous)
                return label + b" after " + (previous or b"-")

            return make

        a, b = key(b"a"), key(b"b")
        assert backend.ref_update("chain", None, a, entry(b"1"))
        assert backend.ref_update("chain", a, None, entry(b"2"))
        assert backend.ref_update("chain", None, b, b"plain")
        assert not backend.ref_update("chain", a, b, entry(b"lost"))  # lost: not logged
        assert backend.ref_update("chain", b, a, entry(b"3"))
        assert backend.ref_log("chain") == [
            b"1 after -",
            b"2 after 1 after -",
            b"plain",
            b"3 after plain",
        ]
        assert seen == [None, b"1 after -", b"plain"]

    def test_ref_log_empty_entry(self, backend: Backend) -> None:
        assert backend.ref_update("e", None, key(b"a"), b"")
        assert backend.ref_log("e") == [b""]

    def test_ref_log_names(self, backend: Backend) -> None:
        a = key(b"a")
        backend.ref_update("live", None, a, b"")
        backend.ref_update("dead", None, a, b"")
        backend.ref_update("dead", a, None, b"")
        backend.ref_update("x/y", None, a, b"")
        assert list(backend.ref_log_names()) == ["dead", "live", "x/y"]
        assert [n for n, _ in backend.ref_iter()] == ["live", "x/y"]

    def test_ref_get_many(self, backend: Backend) -> None:
        a, b = key(b"a"), key(b"b")
        backend.ref_update("runs/slots/1", None, a, b"")
        backend.ref_update("x@1+2=3/a_b-c.d", None, b, b"")
        backend.ref_update("gone", None, a, b"")
        backend.ref_update("gone", a, None, b"")
        names = ["x@1+2=3/a_b-c.d", "never", "runs/slots/1", "gone", "runs/slots", "runs/slots/1"]
        assert backend.ref_get_many(names) == [b, None, a, None, None, a]
        assert backend.ref_get_many([]) == []
        assert backend.ref_get_many(("runs/slots/1",)) == [a]  # any sequence

    def test_ref_get_many_agrees_with_ref_get(self, backend: Backend) -> None:
        names = [f"runs/slots/{counter_key(i).hex()}" for i in range(50)]
        for i, name in enumerate(names[::2]):
            assert backend.ref_update(name, None, counter_key(i), b"")
        assert backend.ref_get_many(names) == [backend.ref_get(n) for n in names]

    def test_ref_histories_agree_with_ref_log_and_ref_get(self, backend: Backend) -> None:
        a, b = key(b"a"), key(b"b")
        backend.ref_update("a", None, a, b"a1")
        backend.ref_update("a", a, b, b"a2")
        backend.ref_update("a/b", None, a, b"ab1")  # a name, then one it begins
        backend.ref_update("a.b", None, b, b"a.b1")
        backend.ref_update("gone", None, a, b"g1")
        backend.ref_update("gone", a, None, b"g2")  # deleted: its history is kept
        names = ["gone", "a/b", "never", "a", "a.b", "a", "a/"]  # unsorted, repeated
        assert backend.ref_histories(names) == [
            (backend.ref_log(n), backend.ref_get(n)) for n in names
        ]
        assert backend.ref_histories(["a"]) == [([b"a1", b"a2"], b)]
        assert backend.ref_histories([]) == []

    def test_ref_get_prefixed(self, backend: Backend) -> None:
        ids = [counter_key(i) for i in range(20)]
        for i, raw in enumerate(ids[::3]):
            assert backend.ref_update("runs/slots/" + raw.hex(), None, counter_key(100 + i), b"")
        backend.ref_update("other/" + ids[1].hex(), None, counter_key(1), b"")
        asked = [*ids, ids[0]]
        got = backend.ref_get_prefixed("runs/slots/", asked)
        assert got == [backend.ref_get("runs/slots/" + raw.hex()) for raw in asked]
        assert got[0] == counter_key(100) and got[1] is None and got[3] == counter_key(101)
        assert backend.ref_get_prefixed("runs/slots/", []) == []
        assert backend.ref_get_prefixed("nothing/", ids[:2]) == [None, None]
        # no ref under the prefix, whatever sorts beside it: after every name, or next to
        # names that start with all of it but its last character
        assert backend.ref_get_prefixed("zzz/", ids[:2]) == [None, None]
        assert backend.ref_get_prefixed("runs/slot/", ids[:2]) == [None, None]
        backend.ref_update("lone/" + ids[2].hex(), None, counter_key(2), b"")
        assert backend.ref_get_prefixed("lone/", ids[1:3]) == [None, counter_key(2)]
        backend.ref_update("lone/" + ids[2].hex(), counter_key(2), None, b"")
        assert backend.ref_get_prefixed("lone/", ids[1:3]) == [None, None]

    def test_refs_and_objects_are_separate(self, backend: Backend) -> None:
        a = key(b"a")
        backend.ref_update("r", None, a, b"")
        assert list(backend.iter_keys()) == []
        assert not backend.contains(a)

    # -- concurrency ---------------------------------------------------------------------------
    threads: int = 8
    increments_per_thread: int = 10

    def test_threads_lose_no_update(self, backend: Backend) -> None:
        if not backend.supports_atomic_refs:
            _skip(f"{backend!r}: ref updates are not atomic across writers")
        errors: list[BaseException] = []

        def work() -> None:
            try:
                increment(backend, "counter", self.increments_per_thread)
            except BaseException as exc:  # surfaced below; a thread cannot fail the test
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(self.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        total = self.threads * self.increments_per_thread
        value = backend.ref_get("counter")
        assert value is not None
        assert backend.get(value) == b"%d" % total
        log = backend.ref_log("counter")
        assert log == [b"%d->%d" % (i, i + 1) for i in range(total)]
