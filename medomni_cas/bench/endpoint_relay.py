"""The model endpoint as the harness sees it: a relay on loopback that logs each trial's calls.

A process agent is an untrusted program, so what it says of its endpoint is a claim: an
``infra_error`` in its ``MEDOMNI_RUN_INFO`` would get a run it did badly run again instead of
scored. The process runner therefore puts this relay between an agent and the endpoint its
config names (``settings.endpoint_env``): the agent's copy of that variable points at
``http://127.0.0.1:PORT/t/<token>/<the endpoint's path>``, one unguessable token per trial, and
the relay forwards each request to the real endpoint as it is (headers, body, the answer
streamed back). For each trial it logs every call's outcome as the relay itself saw it:

* the endpoint's HTTP status;
* ``timeout``: no answer (or no next chunk) within ``settings.endpoint_timeout_sec`` (default
  120 s), after which the relay answers the agent 504 itself;
* ``unreachable``: no connection to the endpoint (the relay answers 502).

An agent's infrastructure claim counts only when that log holds a fault (a 5xx, a 429, a
time-out, no connection): `EndpointRelay.faults`. A call the agent gave up on before the
relay's deadline is waited for, up to that deadline, so a hang the agent saw first is still
seen by the harness. A request with no token, or the token of a trial that ended, is refused
(401/403) and reaches no endpoint.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from medomni_cas._extras import require

__all__ = ["DEFAULT_TIMEOUT_SEC", "Call", "EndpointRelay", "relayable"]

DEFAULT_TIMEOUT_SEC = 120.0
PREFIX = "/t/"
# hop-by-hop headers (RFC 9110 7.6.1) and those the client library sets itself
_DROP = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
    }
)


def relayable(url: str) -> bool:
    """Whether the relay can stand in front of ``url`` (http or https with a host)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass
class Call:
    """One request of a trial, as the relay saw it end (``outcome`` "" while pending)."""

    path: str
    started: float
    deadline: float
    outcome: str = ""  # "200", "504", ..., "timeout", "unreachable"
    detail: str = ""

    @property
    def fault(self) -> bool:
        if self.outcome in ("timeout", "unreachable"):
            return True
        return self.outcome.isdigit() and (int(self.outcome) >= 500 or self.outcome == "429")

    def describe(self) -> str:
        what = {
            "timeout": "no answer within the relay's time-out",
            "unreachable": "no connection",
        }.get(self.outcome, f"HTTP {self.outcome}")
        return f"{self.path}: {what}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class _Trial:
    calls: list[Call] = field(default_factory=list)


class EndpointRelay:
    """The relay of one job to ``upstream`` (the endpoint URL the config names); serve its
    ``app`` with `medomni_cas.bench.perception.serve`."""

    def __init__(self, upstream: str, timeout: float = DEFAULT_TIMEOUT_SEC) -> None:
        if not relayable(upstream):
            raise ValueError(f"the relay forwards to http(s) URLs, not {upstream!r}")
        parts = urlsplit(upstream)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")
        self.timeout = float(timeout)
        self.refused = 0
        self._trials: dict[str, _Trial] = {}
        self._ended: dict[str, _Trial] = {}
        self._lock = threading.Lock()

    @property
    def app(self) -> EndpointRelay:  # `serve` takes anything with an ASGI ``app``
        return self

    # -- trials ------------------------------------------------------------------------------
    def issue(self) -> str:
        import secrets

        token = secrets.token_hex(16)
        with self._lock:
            self._trials[token] = _Trial()
        return token

    def url(self, relay_url: str, token: str) -> str:
        """What the agent gets in place of the endpoint's URL."""
        return f"{relay_url}{PREFIX}{token}{self.base_path}"

    def revoke(self, token: str) -> None:
        """End the token: later requests are refused; its log stays for `faults`."""
        with self._lock:
            trial = self._trials.pop(token, None)
            if trial is not None:
                self._ended[token] = trial

    def calls(self, token: str) -> list[Call]:
        with self._lock:
            trial = self._trials.get(token) or self._ended.get(token)
            return list(trial.calls) if trial is not None else []

    def settle(self, token: str) -> None:
        """Wait until each of the trial's calls has ended, each at most to its deadline."""
        while True:
            pending = [c for c in self.calls(token) if not c.outcome]
            if not pending or time.monotonic() > max(c.deadline for c in pending) + 2.0:
                return
            time.sleep(0.02)

    def faults(self, token: str) -> list[Call]:
        """The trial's calls that the endpoint failed (after `settle`)."""
        self.settle(token)
        return [c for c in self.calls(token) if c.fault]

    def forget(self, token: str) -> None:
        with self._lock:
            self._trials.pop(token, None)
            self._ended.pop(token, None)

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return
        from starlette.responses import JSONResponse

        path: str = scope.get("path", "")
        if path == "/health":
            await JSONResponse({"ok": True})(scope, receive, send)
            return
        token, rest = "", ""
        if path.startswith(PREFIX):
            token, _, rest = path[len(PREFIX) :].partition("/")
        with self._lock:
            trial = self._trials.get(token) if token else None
        if trial is None:
            self.refused += 1
            status = 401 if not token else 403
            error = "no trial token" if not token else "this token's trial is not running"
            await _error(scope, receive, send, status, error)
            return
        now = time.monotonic()
        call = Call("/" + rest, now, now + self.timeout)
        with self._lock:
            trial.calls.append(call)
        try:
            await self._forward(scope, receive, send, call)
        finally:
            if not call.outcome:  # cancelled on the way: the endpoint gave no answer
                call.outcome, call.detail = "timeout", "the relay stopped waiting"

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any, call: Call) -> None:
        httpx = require("httpx", "bench", "the model endpoint relay")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope.get("headers", [])
            if k.decode("latin-1").lower() not in _DROP
        ]
        query = scope.get("query_string", b"").decode("latin-1")
        target = self.origin + call.path + (f"?{query}" if query else "")
        timeout = httpx.Timeout(self.timeout)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            request = client.build_request(
                scope.get("method", "GET"), target, headers=headers, content=bytes(body)
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.TimeoutException as e:
                call.outcome, call.detail = "timeout", f"{self.timeout:g} s, {type(e).__name__}"
                await _error(scope, receive, send, 504, "the endpoint did not answer in time")
                return
            except httpx.TransportError as e:
                call.outcome, call.detail = "unreachable", type(e).__name__
                await _error(scope, receive, send, 502, "the endpoint could not be reached")
                return
            try:
                kept = [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in response.headers.multi_items()
                    if k.lower() not in _DROP and k.lower() != "content-encoding"
                ]
                call.outcome = str(response.status_code)  # a fault mid-answer overrides it
                await send(
                    {"type": "http.response.start", "status": response.status_code, "headers": kept}
                )
                try:
                    async for chunk in response.aiter_bytes():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except httpx.TimeoutException:
                    call.outcome, call.detail = "timeout", "the answer stopped mid-way"
                    await send({"type": "http.response.body", "body": b""})
                    return
                except httpx.TransportError as e:
                    call.outcome, call.detail = "unreachable", f"mid-answer, {type(e).__name__}"
                    await send({"type": "http.response.body", "body": b""})
                    return
                await send({"type": "http.response.body", "body": b""})
            finally:
                await response.aclose()


async def _error(scope: dict[str, Any], receive: Any, send: Any, status: int, why: str) -> None:
    from starlette.responses import JSONResponse

    body = {"error": {"message": f"medomni relay: {why}", "type": "relay_error"}}
    await JSONResponse(body, status)(scope, receive, send)
