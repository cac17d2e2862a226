"""The Harbor adapter's host-side perception relay (`medomni_harbor.agents._Relay`): a
trial's agent command reaches the perception service through it, and it must never stall
the other trials of the job, which share this process's event loop."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import pytest

pytest.importorskip("harbor")

from harbor.environments.base import ExecResult
from medomni_harbor.agents import _Relay


class _Container:
    """The environment's ``exec``, as the relay uses it: it answers each request replayed
    'in the container' with a fixed HTTP response."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    async def exec(self, command: str, **_: object) -> ExecResult:
        self.commands.append(command)
        body = b'{"encoders": []}'
        raw = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        return ExecResult(stdout=raw.decode(), stderr="", return_code=0)


def test_closing_the_relay_leaves_the_event_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its HTTP server's shutdown waits for the serving loop to notice (up to its poll
    interval: half a second by default); done on the event loop's thread it held every
    concurrent trial of the job still (perception trials ran at 0.54x the rate of those
    without, all in lockstep). It is done in another thread, and the loop keeps running."""
    from socketserver import BaseServer

    shut_in: list[threading.Thread] = []
    real = BaseServer.shutdown

    def shutdown(self: BaseServer) -> None:
        shut_in.append(threading.current_thread())
        real(self)

    monkeypatch.setattr(BaseServer, "shutdown", shutdown)
    container = _Container()

    async def trial() -> tuple[bytes, threading.Thread]:
        loop_thread = threading.current_thread()
        async with _Relay(container, "http://perception:8899") as relay:

            def get() -> bytes:
                with urllib.request.urlopen(f"{relay.url}/v1/encoders", timeout=30) as r:
                    return bytes(r.read())

            answer = await asyncio.to_thread(get)
        return answer, loop_thread

    answer, loop_thread = asyncio.run(trial())
    assert answer == b'{"encoders": []}'
    assert len(container.commands) == 1 and "nc -w" in container.commands[0]
    assert shut_in and all(t is not loop_thread for t in shut_in), shut_in
