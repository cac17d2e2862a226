"""Serving the viewer: a socket bound first (so a bad host or port is a clear error), then
uvicorn on it, in the foreground (`serve`) or in a background thread (`serving`)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from medomni_cas._extras import require
from medomni_cas.errors import MedomniError
from medomni_cas.view.app import LOOPBACK_HOSTS

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "BindError", "allowed_hosts", "bind", "serve", "serving"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
_WILDCARDS = ("0.0.0.0", "::", "")


class BindError(MedomniError, ValueError):
    """The viewer cannot listen where it was asked to (the message names host and port)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one); `BindError` naming both."""
    if not 0 <= port <= 65535:
        raise BindError(f"--port {port}: not a port number (0 to 65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise BindError(f"--host {host!r}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def allowed_hosts(host: str) -> list[str]:
    """The Host names a request may use: loopback names, and the host given unless it is a
    wildcard (listening on every address: then any name, the user's choice)."""
    if host in _WILDCARDS:
        return ["*"]
    return list(dict.fromkeys([*LOOPBACK_HOSTS, host]))


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host in _WILDCARDS else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/"


def _server(app: Any, started: Callable[[], object] | None = None) -> Any:
    """uvicorn's server for ``app``; ``started`` is called once it has started."""
    uvicorn = require("uvicorn", "view", "medomni view")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")

    base: Any = uvicorn.Server  # imported when a viewer is served (the ``view`` extra)

    class Server(base):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and started is not None:
                started()

    return Server(config)


def serve(app: Any, sock: socket.socket, *, ready: Callable[[str], object] | None = None) -> None:
    """Serve ``app`` on ``sock`` until interrupted (uvicorn handles SIGINT and SIGTERM in
    the main thread); ``ready`` gets the URL once it has started.

    Not before: uvicorn's handlers are in place by then, so a Ctrl-C on seeing the URL
    stops it cleanly rather than raising in whatever the main thread is importing (which
    can leave the import lock held, and any other thread's import waiting on it)."""
    url = url_of(sock)
    server = _server(app, None if ready is None else lambda: ready(url))
    server.run(sockets=[sock])


@contextlib.contextmanager
def serving(
    app: Any, host: str = DEFAULT_HOST, port: int = 0, *, timeout: float = 30.0
) -> Iterator[str]:
    """Serve ``app`` in a background thread; yield its URL once it accepts requests."""
    sock = bind(host, port)
    server = _server(app)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="medomni-view", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not server.started:
            if not thread.is_alive():
                raise BindError(f"the viewer did not start on {host}:{port}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the viewer did not start within {timeout} s")
            time.sleep(0.01)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)
        sock.close()
