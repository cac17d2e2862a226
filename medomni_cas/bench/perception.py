"""The perception gateway: the run side of the encoder arms, one per atom task.

It serves encoders over HTTP beside the agent (``http://perception:8899`` in a container,
loopback for the process runner) and adds what the Runs spec asks of the perception service:

* a call budget per atom task: an encode call past it is refused (429);
* a family filter: only encoders reading a family staged for this patient, whose input files
  are there, are listed or served, and only for those families (anything else is 404);
* a call log: every encode call, refused ones too, as an `EncoderCall`, kept in memory and
  optionally appended as JSON lines to a file (so a sidecar's log can be collected).

The gateway reads the evidence once, when it is made: it lists ``evidence_dir`` and keeps the
bytes of every file a served encoder reads. A request names encoders and families, never a
path, so it cannot reach any other file, and files the agent writes later (the evidence
folder may be its workspace) are never served.

Endpoints::

    GET  /              what this is, and the endpoints
    GET  /health        {"ok": true}
    GET  /v1/encoders   [{name, version, description, families, digest, level, params}]
                        (headers X-Budget and X-Calls-Left: the calls this task has left)
    POST /v1/encode     {"encoder": name, "family": f (optional if only one), "params": {}}
                        -> {"encoder", "version", "digest", "family", "features",
                            "calls_left"}; errors are {"error": text, "calls_left": n}
                        400 bad request, 404 unknown encoder or family not served,
                        413 body too large, 422 the encoder cannot use the input,
                        429 budget spent, 500 the encoder failed

One server can serve many atom tasks' gateways at once (the process runner's): a `Tokens`
router hands a request to the gateway of the trial whose token its path carries,
``MEDOMNI_PERCEPTION_URL=http://127.0.0.1:<port>/t/<token>``, and refuses one without a
token (401) or with a token no running trial holds (403), crediting it to no trial.

Run it as a sidecar with ``python -m medomni_cas.bench.perception --evidence DIR ...``. The
web stack (starlette, uvicorn) is the ``bench`` extra: this module imports without it, and
making a gateway without it says what to install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import blake3
import msgspec

from medomni_cas._extras import require
from medomni_cas.bench.encoder_calls import EncoderCall, Status, meets_arm, read_call_log
from medomni_cas.bench.encoders import (
    Encoder,
    EncoderError,
    canonical_json,
    encoders,
    input_names,
    level_of,
)

if TYPE_CHECKING:  # the web stack is the `bench` extra: imported when a gateway is made
    from starlette.requests import Request
    from starlette.responses import JSONResponse

__all__ = [
    "DEFAULT_PORT",
    "EncoderCall",
    "Gateway",
    "Tokens",
    "main",
    "meets_arm",
    "read_call_log",
    "serve",
]

DEFAULT_PORT = 8899
MAX_BODY = 64 * 1024  # an encode request is a name, a family and a few params


class _Served:
    """One encoder as this gateway serves it: per served family, its input files."""

    def __init__(self, encoder: Encoder, inputs: dict[str, list[str]]) -> None:
        self.encoder = encoder
        self.inputs = inputs


class _Refusal(Exception):
    """An encode request the gateway answers with an error, before any encoder runs."""

    def __init__(self, http_status: int, detail: str) -> None:
        super().__init__(detail)
        self.http_status = http_status
        self.detail = detail


class Gateway:
    """The perception gateway of one atom task: its encoders, budget and call log.

    ``families`` are the families staged for the task (`AtomTask.families`). ``family_of``
    maps evidence file names to their family; without it a file counts for every staged
    family, and each encoder picks its files by name (``ecg.*``, ``labs.jsonl``).
    """

    def __init__(
        self,
        evidence_dir: str | Path,
        families: Sequence[str],
        budget: int,
        encoders: Mapping[str, Encoder] | None = None,
        *,
        atom: str = "",
        log_path: str | Path | None = None,
        family_of: Mapping[str, str] | None = None,
    ) -> None:
        if budget < 0:
            raise ValueError(f"budget must be 0 or more, got {budget}")
        self.atom = atom
        self.families = tuple(dict.fromkeys(families))
        self.budget = budget
        self.log_path = Path(log_path) if log_path is not None else None
        self.calls: list[EncoderCall] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._used = 0
        available = _registry() if encoders is None else dict(encoders)
        names = _listing(Path(evidence_dir))
        self._served: dict[str, _Served] = {}
        for name, enc in sorted(available.items()):
            per_family: dict[str, list[str]] = {}
            for fam in enc.families:
                if fam not in self.families:
                    continue  # the family filter: a family not staged is never served
                own = [n for n in names if family_of is None or family_of.get(n) == fam]
                picked = input_names(enc, fam, own)
                if picked is not None:
                    per_family[fam] = picked
            if per_family:
                self._served[name] = _Served(enc, per_family)
        # A snapshot of exactly what may be served: later writes to the folder never are.
        wanted = {n for s in self._served.values() for ns in s.inputs.values() for n in ns}
        self._files = {n: (Path(evidence_dir) / n).read_bytes() for n in sorted(wanted)}
        _web()
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.app = Starlette(
            routes=[
                Route("/", self._index, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/encoders", self._list, methods=["GET"]),
                Route("/v1/encode", self._encode, methods=["POST"]),
            ]
        )

    # -- what the run record reads ----------------------------------------------------------
    @property
    def calls_left(self) -> int:
        return max(0, self.budget - self._used)

    def listing(self) -> list[dict[str, Any]]:
        """The encoders served for this task, as ``GET /v1/encoders`` lists them."""
        out = []
        for name, s in self._served.items():
            enc = s.encoder
            out.append(
                {
                    "name": name,
                    "version": enc.version,
                    "description": enc.description,
                    "families": list(s.inputs),
                    "digest": enc.digest,
                    "level": level_of(enc),
                    "params": list(getattr(enc, "call_params", ())),
                }
            )
        return out

    def encoders_served(self) -> list[dict[str, str]]:
        """Name, version and digest of each encoder served, for the run record."""
        return [
            {"name": n, "version": s.encoder.version, "digest": s.encoder.digest}
            for n, s in self._served.items()
        ]

    # -- endpoints (starlette is imported in each, not by the module: the `bench` extra) -----
    async def _index(self, request: Request) -> JSONResponse:
        from starlette.responses import JSONResponse

        return JSONResponse(
            {
                "service": "MedOmni perception gateway",
                "atom": self.atom,
                "families": list(self.families),
                "endpoints": {
                    "GET /v1/encoders": "the encoders served for this task",
                    "POST /v1/encode": '{"encoder": name, "family": f, "params": {}}',
                },
            }
        )

    async def _health(self, request: Request) -> JSONResponse:
        from starlette.responses import JSONResponse

        return JSONResponse({"ok": True})

    async def _list(self, request: Request) -> JSONResponse:
        # a plain list, as agents read it; the budget travels in headers
        headers = {"x-calls-left": str(self.calls_left), "x-budget": str(self.budget)}
        from starlette.responses import JSONResponse

        return JSONResponse(self.listing(), headers=headers)

    async def _encode(self, request: Request) -> JSONResponse:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        started, t0 = datetime.now(UTC).isoformat(timespec="milliseconds"), time.perf_counter()
        with self._lock:
            self._seq += 1
            seq = self._seq
        known: dict[str, str] = {}  # what the request named so far, for the log
        try:
            body = await _bounded_body(request)
            served, family, params = self._parse(body, known)
            with self._lock:  # check and spend in one step: concurrent calls cannot overspend
                if self._used >= self.budget:
                    raise _Refusal(429, f"call budget spent: {self.budget} calls per task")
                self._used += 1
        except _Refusal as r:
            enc = self._served[known["encoder"]].encoder if known.get("served") else None
            self._log(
                seq=seq,
                encoder=known.get("encoder", ""),
                enc=enc,
                family=known.get("family", ""),
                status="refused",
                http_status=r.http_status,
                started=started,
                t0=t0,
                detail=r.detail,
            )
            return JSONResponse(
                {"error": r.detail, "calls_left": self.calls_left}, status_code=r.http_status
            )
        enc = served.encoder
        names = served.inputs[family]
        files = {n: self._files[n] for n in names}
        h = blake3.blake3()
        for n in names:
            h.update(files[n])
        input_digest = h.hexdigest()
        try:
            features = await run_in_threadpool(enc.encode, files, params)
            out = canonical_json(features)  # also proves the features are JSON
            status: Status = "ok"
            http_status, detail = 200, ""
        except EncoderError as e:
            status, http_status, detail, out = "error", 422, str(e), b""
        except Exception as e:  # a broken encoder answers 500 and is logged; the server lives
            status, http_status, detail, out = "error", 500, f"{type(e).__name__}: {e}", b""
        self._log(
            seq=seq,
            encoder=enc.name,
            enc=enc,
            family=family,
            status=status,
            http_status=http_status,
            started=started,
            t0=t0,
            detail=detail,
            inputs=tuple(names),
            input_digest=input_digest,
            output_digest=blake3.blake3(out).hexdigest() if out else "",
        )
        if status != "ok":
            return JSONResponse(
                {"error": f"{enc.name}: {detail}", "calls_left": self.calls_left},
                status_code=http_status,
            )
        return JSONResponse(
            {
                "encoder": enc.name,
                "version": enc.version,
                "digest": enc.digest,
                "family": family,
                "features": msgspec.json.decode(out),
                "calls_left": self.calls_left,
            }
        )

    def _parse(self, body: bytes, known: dict[str, str]) -> tuple[_Served, str, dict[str, Any]]:
        """The encoder, family and params a request names, or the `_Refusal` saying why not."""
        if len(body) > MAX_BODY:
            raise _Refusal(413, f"request body over {MAX_BODY} bytes")
        try:
            req = json.loads(body)
        except ValueError as e:
            raise _Refusal(400, f"request body is not JSON: {e}") from None
        if not isinstance(req, dict):
            raise _Refusal(400, 'request body must be a JSON object: {"encoder": name, ...}')
        unknown = sorted(set(req) - {"encoder", "family", "params"})
        if unknown:
            raise _Refusal(400, f"unknown fields {unknown} (fields: encoder, family, params)")
        name = req.get("encoder")
        if not isinstance(name, str) or not name:
            raise _Refusal(400, "name an encoder: GET /v1/encoders lists them")
        known["encoder"] = name
        if name not in self._served:
            raise _Refusal(404, f"no encoder {name!r} is served for this task")
        known["served"] = "1"
        served = self._served[name]
        family = req.get("family")
        if family is None:
            if len(served.inputs) != 1:
                raise _Refusal(400, f"{name}: name a family, one of {', '.join(served.inputs)}")
            (family,) = served.inputs
        if not isinstance(family, str):
            raise _Refusal(400, "family must be a string")
        known["family"] = family
        if family not in self.families:
            raise _Refusal(404, f"family {family!r} is not staged for this task")
        if family not in served.inputs:
            raise _Refusal(404, f"{name} does not serve family {family!r} for this task")
        params = req.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise _Refusal(400, "params must be a JSON object")
        return served, family, params

    def _log(
        self,
        *,
        seq: int,
        encoder: str,
        enc: Encoder | None,
        family: str,
        status: Status,
        http_status: int,
        started: str,
        t0: float,
        detail: str,
        inputs: tuple[str, ...] = (),
        input_digest: str = "",
        output_digest: str = "",
    ) -> None:
        call = EncoderCall(
            atom=self.atom,
            seq=seq,
            encoder=encoder,
            encoder_version=enc.version if enc is not None else "",
            encoder_digest=enc.digest if enc is not None else "",
            family=family,
            status=status,
            http_status=http_status,
            started=started,
            elapsed_ms=round((time.perf_counter() - t0) * 1000, 3),
            input_digest=input_digest,
            output_digest=output_digest,
            detail=detail[:2000],  # a refusal quotes the request: keep the log bounded
            inputs=inputs,
            level=level_of(enc) if enc is not None else "",
        )
        with self._lock:
            self.calls.append(call)
            if self.log_path is not None:
                # one write per call, flushed on close: a reader never sees half a line
                with self.log_path.open("ab") as f:
                    f.write(msgspec.json.encode(call) + b"\n")


async def _bounded_body(request: Request) -> bytes:
    """The request's body, read chunk by chunk as it arrives and refused (413) once it
    passes `MAX_BODY`, before the rest is read: a chunked upload has no length to check
    up front, and buffering it whole would let any caller grow the gateway at will."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > MAX_BODY:  # declared too large: not read at all
        raise _Refusal(413, f"request body over {MAX_BODY} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise _Refusal(413, f"request body over {MAX_BODY} bytes (stopped reading it)")
    return bytes(body)


class Tokens:
    """An ASGI app routing ``/t/<token>/...`` to the gateway the token was issued for.

    `issue` gives a trial's gateway a fresh unguessable token; `revoke` ends it, so a
    process the trial left behind (or any other) gets 403 and is credited to no trial.
    ``/health`` needs no token (`serve` polls it). ``refused`` counts the refusals.
    """

    PREFIX = "/t/"

    def __init__(self) -> None:
        self._gateways: dict[str, _Servable] = {}
        self.refused = 0

    @property
    def app(self) -> Tokens:  # `serve` takes anything with an ASGI ``app``
        return self

    def issue(self, gateway: _Servable) -> str:
        token = secrets.token_hex(16)
        self._gateways[token] = gateway
        return token

    def revoke(self, token: str) -> None:
        self._gateways.pop(token, None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return  # no websockets; lifespan is off
        from starlette.responses import JSONResponse

        path: str = scope.get("path", "")
        if path == "/health":
            await JSONResponse({"ok": True})(scope, receive, send)
            return
        token, rest = "", ""
        if path.startswith(self.PREFIX):
            token, _, rest = path[len(self.PREFIX) :].partition("/")
        gateway = self._gateways.get(token) if token else None
        if gateway is None:
            self.refused += 1
            if not token:
                error, status = "no trial token: use the URL in MEDOMNI_PERCEPTION_URL", 401
            else:
                error, status = "this token's atom task is not running", 403
            await JSONResponse({"error": error}, status)(scope, receive, send)
            return
        inner = dict(scope, path="/" + rest, raw_path=("/" + rest).encode())
        await gateway.app(inner, receive, send)


def _registry() -> dict[str, Encoder]:
    return encoders()


def _listing(folder: Path) -> list[str]:
    """Names of the regular files directly in ``folder`` (symlinks could point anywhere)."""
    return sorted(e.name for e in folder.iterdir() if e.is_file() and not e.is_symlink())


# -- serving ------------------------------------------------------------------------------------
def _web() -> Any:
    """The web stack (starlette, uvicorn: the `bench` extra); uvicorn's module, to serve."""
    require("starlette", "bench", "the perception gateway")
    return require("uvicorn", "bench", "the perception gateway")


class _Servable(Protocol):
    """What `serve` serves: anything with an ASGI ``app`` (a `Gateway`, or a stand-in)."""

    @property
    def app(self) -> Any: ...


@contextlib.contextmanager
def serve(
    gateway: _Servable, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, timeout: float = 10.0
) -> Iterator[str]:
    """Serve ``gateway`` with uvicorn in a background thread; yield its base URL.

    It yields once the server answers ``/health``; port 0 picks a free port, and the URL
    names the one bound. Leaving the block stops the server.
    """
    uvicorn = _web()

    config = uvicorn.Config(
        gateway.app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)

    def run() -> None:
        # uvicorn calls sys.exit when it cannot bind: end this thread quietly, `serve` reports it
        with contextlib.suppress(SystemExit):
            server.run()

    thread = threading.Thread(target=run, name=f"perception-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not server.started:
            if not thread.is_alive():  # uvicorn exits the thread when it cannot bind
                raise OSError(f"perception gateway could not listen on {host}:{port}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"perception gateway did not start within {timeout} s")
            time.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        shown = f"[{shown}]" if ":" in shown else shown
        url = f"http://{shown}:{bound}"
        _wait_healthy(url, deadline)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)


def _wait_healthy(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"perception gateway at {url} does not answer") from None
            time.sleep(0.02)


# -- sidecar CLI --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Run one atom task's gateway in the foreground (a sidecar's command)."""
    p = argparse.ArgumentParser(
        prog="python -m medomni_cas.bench.perception",
        description="The MedOmni perception gateway of one atom task.",
    )
    p.add_argument("--evidence", type=Path, required=True, help="the task's evidence folder")
    p.add_argument("--families", required=True, help="staged families, comma-separated")
    p.add_argument("--budget", type=int, required=True, help="encode calls for this task")
    p.add_argument("--atom", default="", help="the atom task's id, for the log")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--log", type=Path, default=None, help="append each call here as JSON lines")
    p.add_argument("--family-of", type=Path, default=None, help="JSON: file name -> family")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    family_of = json.loads(args.family_of.read_bytes()) if args.family_of else None
    gateway = Gateway(
        args.evidence,
        [f.strip() for f in args.families.split(",") if f.strip()],
        budget=args.budget,
        atom=args.atom,
        log_path=args.log,
        family_of=family_of,
    )
    uvicorn = _web()

    served = ", ".join(f"{e['name']} ({'/'.join(e['families'])})" for e in gateway.listing())
    print(
        f"perception gateway: atom {args.atom or '-'}, budget {args.budget}, "
        f"serving {served or 'nothing'} on {args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    # In the main thread uvicorn handles SIGTERM/SIGINT itself: `docker stop` ends it cleanly.
    uvicorn.Server(
        uvicorn.Config(
            gateway.app, host=args.host, port=args.port, log_level=args.log_level, lifespan="off"
        )
    ).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
