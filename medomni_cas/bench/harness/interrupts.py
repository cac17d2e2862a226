"""SIGINT and SIGTERM stop the harness cleanly: it ends the trial in flight, starts no other,
and records what finished.

While `stop_on_signals` is active (in the main thread; elsewhere it does nothing), the first
SIGINT or SIGTERM is raised as `Interrupted` where the harness can stop without losing
anything:

- at once where it is interruptible (planning; a runner running a trial, see `each`): the
  runner's cleanup ends the trial (the process runner kills the agent's process group);
- in a `protected` section (running a job), at the next `check` (between claims, before
  the next trial), so recording a run, releasing claims and writing the job are never cut
  in half.

A second signal while the harness cleans up is ignored. `Interrupted` is a `BaseException`,
so a runner's ``except Exception`` does not swallow it; the CLI turns it into exit status
128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

__all__ = ["Interrupted", "check", "each", "interruptible", "protected", "stop_on_signals"]


class Interrupted(BaseException):  # it names what happened, as KeyboardInterrupt
    """The harness was stopped by a signal; ``report`` holds what it recorded (the harness
    fills it in on the way out), ``job`` the report of the job it was running."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.report: Any = None  # harness.RunReport, set by run_set
        self.job: Any = None  # harness.JobReport of the job it stopped, set by _run_job

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


class _State:
    def __init__(self) -> None:
        self.signum = 0  # the first signal caught
        self.raised = False
        self.open = True  # a signal raises at once (else it waits for `check`)


_ACTIVE: list[_State] = []


def _handler(state: _State) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        if state.signum:
            return  # a second signal while the harness cleans up: ignored
        state.signum = signum
        if state.open:
            state.raised = True
            raise Interrupted(signum)

    return handle


@contextlib.contextmanager
def stop_on_signals(signums: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Catch SIGINT and SIGTERM for the block (main thread only); see the module docstring.
    The block is `interruptible` but for its `protected` parts. Also a decorator."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; a harness elsewhere cannot catch them
        return
    state = _State()
    handler = _handler(state)
    old = {s: signal.signal(s, handler) for s in signums}
    _ACTIVE.append(state)
    try:
        yield
    finally:
        _ACTIVE.remove(state)
        for s, h in old.items():
            signal.signal(s, h)


def check() -> None:
    """Raise `Interrupted` if a signal came and has not been raised yet."""
    if _ACTIVE:
        state = _ACTIVE[-1]
        if state.signum and not state.raised:
            state.raised = True
            raise Interrupted(state.signum)


@contextlib.contextmanager
def _opened(value: bool) -> Iterator[None]:
    if not _ACTIVE:
        yield
        return
    state = _ACTIVE[-1]
    before, state.open = state.open, value
    try:
        yield
    finally:
        state.open = before
    if before:
        check()  # a signal that waited for the end of a protected section


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A section a signal cuts short: it raises `Interrupted` at once in here."""
    check()
    with _opened(True):
        yield


@contextlib.contextmanager
def protected() -> Iterator[None]:
    """A section a signal does not cut: it waits for a `check`, an `interruptible` part, or
    the end of the section (when what surrounds it is interruptible). Also a decorator."""
    with _opened(False):
        yield


def each[T](stream: Iterable[T], before: Callable[[], None] | None = None) -> Iterator[T]:
    """The items of a runner's ``stream``, each produced inside `interruptible` (the runner
    runs a trial to produce it), after `check` and ``before`` (the lease's check): the
    harness starts no trial once stopped. The stream is closed when this one is, so a
    runner's cleanup (ending its trials) runs as soon as the harness stops."""
    it = iter(stream)
    try:
        while True:
            check()
            if before is not None:
                before()
            with interruptible():
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
