"""The exact route: with ``MEDOMNI_EXACT_CHECKS=1`` every check takes the definitions.

The fast paths of `medomni_cas.store._fast` must give the answers of `encoding.links` and
`encoding.validate_canonical`. Here the switch is on for every test: the first tests show
that it reaches each fast path (it can be seen: the definitions are called for every
object), and the walk and check tests of the suite's other modules, imported below, run
again this way and must find the same.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import medomni_cas as mc
from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding, sync
from medomni_cas.store._fast import BatchChecker, BatchReader, CheckPool, exact
from medomni_cas.store.backends.lmdb import LMDBBackend
from medomni_cas.store.verify import fsck, verify_closure, walk_checked

# collected here again, so run a second time with the switch on (the fixture below)
from tests.test_check_pool import (  # noqa: F401
    made,
    test_fsck_and_verify_closure_find_the_same_with_helpers,
    test_verify_result_finds_the_same_with_helpers,
)
from tests.test_fast_paths import (  # noqa: F401
    GOOD,
    _objects,
    test_verify_finds_what_only_a_full_decode_sees,
    test_verify_result_follows_a_newer_writers_link,
    test_walk_is_the_one_object_walk,
    test_walk_raises_at_the_bad_object_in_turn,
)
from tests.test_verify import (  # noqa: F401
    build,
    test_dangling_refs,
    test_lmdb_large_object_file_lost,
    test_malformed_objects,
    test_many_problems_at_once_never_raise,
    test_missing_linked_object_names_parent_and_ref,
    test_one_decode_path_agrees_with_the_full_check,
    test_verify_closure_is_restricted_to_its_roots,
)


@pytest.fixture(autouse=True)
def exact_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(exact.ENV, "1")


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of ``encoding.<name>`` (still the real function) from the store."""
    calls: list[int] = []
    real: Callable[..., object] = getattr(encoding, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(encoding, name, counted)
    return calls


def test_the_switch_is_read_where_a_walk_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert exact.exact_checks()
    assert BatchReader().exact and BatchChecker(True).exact
    assert not BatchReader(exact=False).exact  # an argument wins
    monkeypatch.setenv(exact.ENV, "0")
    assert not exact.exact_checks() and not BatchReader().exact
    monkeypatch.delenv(exact.ENV)
    assert not exact.exact_checks()


def test_a_reader_doubts_everything_and_reads_links_by_the_definition() -> None:
    datas = _objects()
    reader = BatchReader()
    ids, owners, doubtful = reader.check(datas)
    assert (ids, owners, doubtful) == ([], [], list(range(len(datas))))
    ids, owners, errors = reader.links(datas, ordered=True)
    for i, data in enumerate(datas):
        try:
            want = encoding.links(data)
        except InvalidObject as e:
            assert str(errors[i]) == str(e)
            continue
        assert [x for x, o in zip(ids, owners, strict=True) if o == i] == want
    # the fast route, for contrast: records our encoder wrote are affirmed without a doubt
    _, _, doubtful = BatchReader(exact=False).check(datas)
    assert set(range(len(GOOD))) - set(doubtful)


def test_every_object_takes_the_full_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = mc.Store(LMDBBackend(tmp_path / "lmdb", durable=False))
    root, _ = build(store, "exact", leaves=40)
    store.refs.set("main", root)
    objects = len(list(store.iter_ids()))
    validated = _counting(monkeypatch, "validate_canonical")
    linked = _counting(monkeypatch, "links")
    report = fsck(store, jobs=1)
    assert report.ok and report.objects == objects
    assert len(validated) == objects and len(linked) >= objects
    validated.clear()
    assert walk_checked(store, [root], canonical=True, jobs=1).bad == {}
    assert len(validated) == objects
    linked.clear()
    assert len(store.closure(root)) == objects
    assert len(linked) == objects  # Store.walk: every object's links by the definition
    monkeypatch.setenv(exact.ENV, "")  # and without the switch, far fewer
    validated.clear()
    assert fsck(store, jobs=1).ok
    assert len(validated) < objects / 4


def test_a_pool_tells_its_helpers(tmp_path: Path) -> None:
    store = mc.Store(LMDBBackend(tmp_path / "lmdb", durable=False))
    with CheckPool(store.backend, True, 2) as pool:
        assert pool.checker.exact
    with CheckPool(store.backend, True, 2, exact=False) as pool:
        assert not pool.checker.exact


def test_sync_and_verify_closure_take_the_exact_route(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    local = mc.open("memory://")
    root, _ = build(local, "sync", leaves=20)
    local.refs.set("main", root)
    objects = len(list(local.iter_ids()))
    validated = _counting(monkeypatch, "validate_canonical")
    remote = mc.open(f"lmdb://{tmp_path}/remote")
    try:
        assert sync.push(local, remote).objects == objects
        assert len(validated) == objects
        validated.clear()
        assert verify_closure(remote, [root]).ok
        assert len(validated) == objects
    finally:
        remote.close()
