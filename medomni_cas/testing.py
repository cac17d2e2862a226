"""A conformance suite for `Backend` implementations, in the style of zarr's ``StoreTests``.

A backend's test module subclasses `BackendTests` and says how to make a fresh, empty
backend, either by overriding `BackendTests.make_backend` or the ``backend`` fixture::

    from medomni_cas.testing import BackendTests

    class TestMyBackend(BackendTests):
        def make_backend(self, tmp_path):
            return MyBackend(tmp_path / "store")

Every test talks to the backend only through the `Backend` interface, so a new backend
gets the whole contract checked for free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from medomni_cas.store.backend import Backend

__all__ = ["BackendTests", "counter_key", "increment"]


def key(data: bytes) -> bytes:
    """The id a store would give ``data`` (the backend does not care, but it looks real)."""
    return blake3.blake3(data).digest()


def counter_key(n: int) -> bytes:
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


class BackendTests:
    """The contract of `Backend`. Subclass, and supply `make_backend` or a ``backend`` fixture."""

    #: How many objects `test_many_objects` puts in one batch.
    many: int = 2000

    def make_backend(self, tmp_path: Path) -> Backend:
        """A fresh, empty backend."""
        raise NotImplementedError(f"{type(self).__name__} must define make_backend")

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        b = self.make_backend(tmp_path)
        yield b
        b.close()

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
        with pytest.raises(KeyError):
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
        keys = [key(b"%d" % i) for i in range(6)]
        backend.put_many((k, b"v") for k in keys)
        assert backend.delete_many([keys[0], keys[1], key(b"never")]) == 2
        assert backend.delete_many([keys[0]]) == 0
        assert sorted(backend.iter_keys()) == sorted(keys[2:])
        with pytest.raises(KeyError):
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
            pytest.skip(f"{backend!r}: ref updates are not atomic across writers")
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
