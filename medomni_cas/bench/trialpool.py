"""Several trials at once: `run_concurrently` keeps N agent processes running for a runner.

Each trial stays as isolated as when they run one by one (its own scratch folder, session
and process group, sandbox and limits); only the waiting is shared. The calling thread
stages every trial (the only step that reads the store) and gets the trials back as they
finish, to record them; worker threads only launch the staged agents and wait for them.
While the harness records one trial the others keep running, and the next is staged
before a finished one is handed back, so the cores stay busy.

Stopping
--------
Closing the stream (the harness stopped: a signal, a lost lease, fail-fast) stops every
trial in flight (`Launch.stop`: SIGTERM to its sandbox, which kills the agent's processes),
kills what is left of their process groups after a grace period, and hands back none of
them: a trial is recorded whole or not at all, and an unrecorded slot is released for the
next try.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol

from medomni_cas.bench.runners import Trial

__all__ = ["Launch", "Remover", "default_concurrency", "run_concurrently"]

_GRACE_SEC = 10.0  # after stopping the trials in flight, before their groups are killed


class Launch(Protocol):
    """One trial as a runner prepares it: staged in the caller's thread, launched in a
    worker, stoppable from any thread."""

    folder: Path

    def stage(self, tokens: Any, url: str) -> Trial | None: ...

    def launch(self) -> Trial: ...

    def stop(self) -> None: ...

    def kill(self) -> None: ...


class Remover(Protocol):
    def remove(self, path: Path) -> None: ...


def default_concurrency() -> int:
    """The cores this process may run on (``os.process_cpu_count`` from Python 3.13)."""
    count = getattr(os, "process_cpu_count", None)
    if count is not None:
        return int(count() or 1)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_concurrently(
    launches: Iterable[Launch], n: int, tokens: Any, url: str, scratch: Remover
) -> Iterator[Trial]:
    """Run ``launches`` ``n`` at a time, yielding each trial as it finishes (its folder is
    removed first); see the module docstring for what closing the stream does."""
    todo = iter(launches)
    running: dict[Future[Trial], Launch] = {}
    ready: list[Trial] = []  # finished (or failed to stage), not handed back yet
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="medomni-trial")

    def fill() -> None:
        while len(running) < n:
            launch = next(todo, None)
            if launch is None:
                return
            failed = launch.stage(tokens, url)
            if failed is not None:
                scratch.remove(launch.folder)
                ready.append(failed)
                continue
            running[pool.submit(launch.launch)] = launch

    try:
        fill()
        while running or ready:
            if not ready:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    launch = running.pop(future)
                    try:
                        ready.append(future.result())
                    finally:
                        scratch.remove(launch.folder)
                fill()  # the next trials start before the harness records these
            yield ready.pop(0)
    finally:
        for launch in running.values():
            launch.stop()
        _, late = wait(running, timeout=_GRACE_SEC)
        for future in late:
            running[future].kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for launch in running.values():
            scratch.remove(launch.folder)
