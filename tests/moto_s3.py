"""moto's S3 server on loopback, with S3's atomic conditional writes.

S3 decides a conditional PUT (``If-None-Match: *``, ``If-Match: <etag>``) atomically: of two
racing writers exactly one wins. moto checks the condition and then writes, without a lock,
so under load two racing PUTs can both pass and one update is silently lost (seen as a
lost append in test_sync's sixteen-writer race). The stand-in must keep the protocol's
promise, or the race tests measure moto instead of our ref protocol: conditional PUTs are
serialised here; everything else is served concurrently, as moto does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.server import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    ThreadedMotoServer,
    create_backend_app,
)
from werkzeug.serving import make_server

__all__ = ["AtomicS3Server"]

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _AtomicConditionalPuts:
    def __init__(self, app: Wsgi) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        conditional = "HTTP_IF_MATCH" in environ or "HTTP_IF_NONE_MATCH" in environ
        if environ.get("REQUEST_METHOD") != "PUT" or not conditional:
            return self.app(environ, start_response)
        with self.lock:  # the check and the write as one step; the body is read inside
            return list(self.app(environ, start_response))


class AtomicS3Server(ThreadedMotoServer):
    """`ThreadedMotoServer` whose conditional PUTs are atomic, as on S3."""

    def _server_entry(self) -> None:
        app = _AtomicConditionalPuts(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()
