"""moto's S3 server on loopback that counts the requests it serves (``python -m`` this).

It prints its port on stdout and serves until stdin closes. ``GET /__counts__`` answers
the counts since the last ``POST /__counts__`` (which resets them) as JSON, by method and
by what the path names (refs, logs, packs, objects, other); conditional PUTs are decided
atomically, as on S3 (as tests/moto_s3.py does for the tests).
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CountingApp", "fetch_counts", "reset_counts"]

_PATH = "/__counts__"
_PARTS = ("refs", "logs", "packs", "objects", "names")

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _part(path: str) -> str:
    for part in _PARTS:
        if f"/{part}/" in path:
            return part
    return "other"


class CountingApp:
    def __init__(self, app: Wsgi) -> None:
        self.app = app
        self.lock = threading.Lock()  # the check and the write of a conditional PUT as one
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path == _PATH:
            if method == "POST":
                self.counts.clear()
            body = json.dumps(dict(self.counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        listing = method == "GET" and "list-type" in environ.get("QUERY_STRING", "")
        self.counts[f"{'LIST' if listing else method} {_part(path)}"] += 1
        conditional = "HTTP_IF_MATCH" in environ or "HTTP_IF_NONE_MATCH" in environ
        if method != "PUT" or not conditional:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))


def fetch_counts(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}{_PATH}", timeout=30) as r:
        counts: dict[str, int] = json.load(r)
        return counts


def reset_counts(endpoint: str) -> None:
    req = urllib.request.Request(f"{endpoint}{_PATH}", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=30).close()


def main() -> None:
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = CountingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, True, request_handler=MotoRequestHandler)
    print(server.port, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
