"""`medomni_cas._gcpause`: the collector off for a call, then as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from medomni_cas._gcpause import gc_paused, paused


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
