"""`medomni_cas._gcpause`: the collector off for a call, then as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import medomni_cas as mc
from medomni_cas._gcpause import gc_paused, paused
from medomni_cas.store.sync import push
from medomni_cas.store.verify import verify_closure


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_in_the_block_and_on_after_it() -> None:
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_on_again_after_a_call_that_raised() -> None:
    @gc_paused
    def fails() -> None:
        assert not gc.isenabled()
        raise KeyError("x")

    with pytest.raises(KeyError):
        fails()
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()


def test_a_nested_pause_leaves_the_outer_one_paused() -> None:
    with paused():
        with paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_wrapped_call_keeps_its_name_and_result() -> None:
    @gc_paused
    def answer(x: int) -> int:
        """The answer."""
        return x * 2

    assert answer(21) == 42 and answer.__name__ == "answer" and answer.__doc__ == "The answer."


def test_push_and_a_checking_walk_read_with_the_collector_paused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push's plan and verify's walk keep what they met to the end (records, levels):
    they read with the collector off, and it is on again after them."""
    src = mc.open(f"lmdb://{tmp_path / 'src'}")
    dst = mc.open(f"lmdb://{tmp_path / 'dst'}")
    leaves = [src.put_blob(b"leaf %d" % i) for i in range(20)]
    root = src.put_tree({f"l{i}": leaf for i, leaf in enumerate(leaves)})
    src.refs.set("sets/x", root)
    collecting: list[bool] = []
    get_list = src.backend.get_list

    def reading(keys: list[bytes]) -> Any:
        collecting.append(gc.isenabled())
        return get_list(keys)

    monkeypatch.setattr(src.backend, "get_list", reading)
    assert push(src, dst, ["sets/x"]).objects == 21
    assert collecting and not any(collecting)
    assert gc.isenabled()
    collecting.clear()
    get_parts = src.backend.get_parts

    def parts(keys: Any, budget: int) -> Any:
        collecting.append(gc.isenabled())
        yield from get_parts(keys, budget)

    monkeypatch.setattr(src.backend, "get_parts", parts)
    assert verify_closure(src, [root], jobs=1).ok
    assert collecting and not any(collecting)
    assert gc.isenabled()
    src.close()
    dst.close()
