"""`CheckPool`: the batches of a closure check, shared with helper processes on big levels.

Checking an object costs a read, a hash and a few C-level passes (`BatchChecker`), all under
one interpreter lock, so one process checks at about the rate of one core. When the store is
a local database that several processes may read at once (`Backend.reader_url`: LMDB), the
big levels of a walk are shared: helper processes open the same store, check batches of ids
with the same `BatchChecker`, and send back each batch's `Findings`. The walk stays in the
calling process: which links are new, what is reported and how.

Helpers
    Helpers only make a check faster; they never change its answer. One starts when a level
    is big enough to pay for its start (a new interpreter that imports the store and the
    record kinds: about 0.15 s, while this process goes on checking). A helper that fails to
    start, dies, or sends something unreadable is dropped, and the batches it held are
    checked here.

Protocol
    Over a helper's stdin and stdout: frames of a 4-byte little-endian length and a body.
    In: `Hello`, then batches (ids back to back, 32 bytes each). Out: `Ready`, then each
    batch's `Findings` in the order the batches came. The helper ends when its stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import select
import struct
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from queue import SimpleQueue
from typing import BinaryIO, NamedTuple

import msgspec

from medomni_cas.store import encoding
from medomni_cas.store._fast.check import BatchChecker, Findings
from medomni_cas.store.backend import Backend
from medomni_cas.store.ids import ID_SIZE

__all__ = ["BATCH", "HELD_BYTES", "MIN_LEVEL", "CheckPool", "Listed", "default_jobs", "merged"]

#: Ids per batch: enough that a batch's C-level passes dominate its Python steps.
BATCH = 4096
#: The smallest level that starts a helper: smaller walks end before one would be ready.
MIN_LEVEL = 4 * BATCH
#: Bytes of objects read and held at once by a check, about (one larger object is held
#: whole): a batch of large objects (a level of image chunks, the columns of a table) is
#: read and checked a part at a time, not 4,096 of them at once.
HELD_BYTES = 32 << 20
_MAX_JOBS = 4  # beyond this the walk itself (new links, reports) is the bottleneck
_IN_FLIGHT = 3  # batches a helper holds: it never idles while this process checks one
_LEN = struct.Struct("<I")
_MAX_FRAME = 1 << 30
_COMMAND = ("-m", "medomni_cas.store._fast.pool")  # run by this interpreter
_log = logging.getLogger(__name__)


def merged(parts: list[Findings]) -> Findings:
    """The findings of a batch checked in parts, as one (owners index the joined sound)."""
    if len(parts) == 1:
        return parts[0]
    out = Findings()
    for f in parts:
        out.objects += f.objects
        out.nbytes += f.nbytes
        out.absent += f.absent
        out.corrupt += f.corrupt
        out.malformed += f.malformed
        out.links += f.links
        out.owners += [len(out.sound) + k for k in f.owners]
        out.sound += f.sound
    return out


class Hello(msgspec.Struct, array_like=True):
    """What a helper needs: the store (its backend class, as ``module:name``, and the URL
    that class opens), the kind of check (canonical, exact), and the modules to import so
    that it reads the record kinds this process knows as fast as this process does."""

    backend: str
    url: str
    canonical: bool
    exact: bool
    modules: list[str]


class Ready(msgspec.Struct, array_like=True):
    error: str = ""  # why the helper cannot check (it then exits)


class Listed(NamedTuple):
    """A batch already read (a pass over the store, `Backend.iter_parts`): checked here as
    it is; a helper given it reads its keys again, in its own process."""

    keys: list[bytes]
    values: list[bytes | None]


#: What `CheckPool.check` takes: ids to read, or a batch read already.
type Batch = list[bytes] | Listed


def default_jobs() -> int:
    """Processes a check uses by default: one per core this process may run on, up to 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_JOBS))


class _Gone(Exception):
    """A helper that cannot be used any more (dead, or not speaking the protocol)."""


class _Helper:
    """One helper process, and the batches it holds (in the order it answers them)."""

    def __init__(self, hello: Hello) -> None:
        # the helper imports what this process can: same interpreter, same search path
        path = [os.getcwd() if p == "" else p for p in sys.path]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if os.path.isdir(p))}
        # a file, not a pipe: a helper that writes much there can never block on it
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *_COMMAND],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.errors,
                bufsize=0,
                env=env,
            )
        except BaseException:
            self.errors.close()
            raise
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = self.proc.stdout.fileno()
        self.ready = False
        self.held: deque[list[bytes]] = deque()
        self.answered = 0
        self.last_words = ""
        # written by a thread: this process never blocks on a full pipe while the helper
        # blocks on its full answer pipe
        self._frames: SimpleQueue[bytes | None] = SimpleQueue()
        self._writer = threading.Thread(
            target=_write_frames, args=(self.proc.stdin, self._frames), daemon=True
        )
        self._writer.start()
        self._frames.put(_frame(msgspec.msgpack.encode(hello)))

    def send(self, batch: Batch) -> None:
        keys = batch.keys if isinstance(batch, Listed) else batch  # read there again
        self.held.append(keys)
        self._frames.put(_frame(b"".join(keys)))

    def readable(self, timeout: float = 0.0) -> bool:
        return bool(select.select([self.out], [], [], timeout)[0])

    def receive(self) -> bytes:
        return _read_frame(self.out)

    def close(self, *, kill: bool = False) -> None:
        self._frames.put(None)
        if kill:
            with contextlib.suppress(OSError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._writer.join(timeout=5)
        # the end of what it wrote to its stderr (a traceback, say), complete now it exited
        with self.errors:
            size = self.errors.seek(0, os.SEEK_END)
            self.errors.seek(max(0, size - 2000))
            self.last_words = self.errors.read().decode(errors="replace").strip()


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def _write_frames(pipe: BinaryIO, frames: SimpleQueue[bytes | None]) -> None:
    with contextlib.suppress(OSError):  # the helper is gone: its reader notices
        fd = pipe.fileno()
        while (frame := frames.get()) is not None:
            _write_all(fd, frame)
    with contextlib.suppress(OSError):
        pipe.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_frame(fd: int) -> bytes:
    (n,) = _LEN.unpack(_read_exactly(fd, _LEN.size))
    if n > _MAX_FRAME:
        raise _Gone(f"frame of {n} bytes")
    return _read_exactly(fd, n)


class _Lazy:
    """Batches taken from an iterator as they are needed, for `CheckPool.check`: the same
    calls as its deque (helpers take from the front too: the level is read in order), and
    batches given back (by a dropped helper) come first."""

    def __init__(self, batches: Iterable[Batch]) -> None:
        self._it = iter(batches)
        self._back: deque[Batch] = deque()

    def __bool__(self) -> bool:
        if not self._back:
            nxt = next(self._it, None)
            if nxt is None:
                return False
            self._back.append(nxt)
        return True

    def popleft(self) -> Batch:
        if self._back:
            return self._back.popleft()
        return next(self._it)

    pop = popleft

    def extend(self, batches: Iterable[Batch]) -> None:
        self._back.extend(batches)


def _read_exactly(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        part = os.read(fd, min(n, 1 << 20))
        if not part:
            raise _Gone("end of stream")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


class CheckPool:
    """The batches of one check, checked here by ``checker`` (a `BatchChecker`) and by the
    helper processes (started on the first big level, ended by `close`), which check the
    same way: ``jobs`` processes in all, this one included; None for `default_jobs`.
    ``exact``: every check by the definitions, here and in the helpers (None: as the
    environment says, `medomni_cas.store._fast.exact`)."""

    def __init__(
        self,
        backend: Backend,
        canonical: bool,
        jobs: int | None = None,
        *,
        exact: bool | None = None,
    ) -> None:
        self.backend = backend
        self.checker = BatchChecker(canonical, exact)
        self.jobs = default_jobs() if jobs is None else jobs
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {self.jobs}")
        # select() on pipes, which waiting for helpers needs, is POSIX only
        self._url = backend.reader_url() if self.jobs > 1 and os.name == "posix" else None
        self._helpers: list[_Helper] = []
        self._started = False
        #: helper processes that checked at least one batch (so far)
        self.helped = 0
        self._checked = 0  # batches checked here, over every call
        self._findings = msgspec.msgpack.Decoder(Findings)
        self._ready = msgspec.msgpack.Decoder(Ready)

    def __enter__(self) -> CheckPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        helpers, self._helpers = self._helpers, []
        for h in helpers:
            # one still starting, or one whose answers will not be read (the walk stopped
            # early), has nothing to finish
            h.close(kill=not h.ready or bool(h.held))

    def listed(self) -> Iterator[Listed]:
        """Every object of the backend, with its bytes, in key order: one pass over the
        store (`Backend.iter_parts`), in batches for `check` (parts of `HELD_BYTES`)."""
        for keys, values in self.backend.iter_parts(HELD_BYTES, BATCH):
            yield Listed(keys, values)

    def check(
        self,
        keys: list[bytes] | Iterable[Batch],
        *,
        owners: bool = False,
        count: int | None = None,
    ) -> Iterator[Findings]:
        """The findings of ``keys`` (32-byte ids), batch by batch in no set order: checked
        here, or by helpers when the level is big. Owners are only kept here (a helper's
        links come without them). ``keys`` may also be batches, taken as they are needed
        (a level too big to hold, or a pass over the store: `Listed`), ``count`` ids in
        all."""
        batches: deque[Batch] | _Lazy
        if isinstance(keys, list):
            batches = deque(keys[i : i + BATCH] for i in range(0, len(keys), BATCH))
            count = len(keys)
        else:
            batches = _Lazy(keys)
        if not owners and (count or 0) >= MIN_LEVEL:
            self._start()
        # the pages read are given back past a budget by the backend's reads
        # (`medomni_cas.store._mapped.note`), not after every batch (each read a fault)
        while True:
            for h in list(self._helpers):
                try:
                    yield from self._collect(h, batches)
                except (_Gone, OSError, msgspec.DecodeError) as e:
                    self._drop(h, batches, f"{type(e).__name__}: {e}")
            if batches:
                # this process from the front, helpers from the back: each reads pages
                # close together in key order
                batch = batches.popleft()
                parts = (
                    [batch]
                    if isinstance(batch, Listed)
                    else self.backend.get_parts(batch, HELD_BYTES)
                )
                for keys, got in parts:
                    yield self.checker(keys, got, owners=owners)
                self._checked += 1
            elif any(h.held for h in self._helpers):
                self._wait(batches)
            else:
                return

    def _start(self) -> None:
        if self._started or self._url is None:
            return
        self._started = True
        cls = type(self.backend)
        hello = Hello(
            f"{cls.__module__}:{cls.__qualname__}",
            self._url,
            self.checker.canonical,
            self.checker.exact,
            encoding.record_modules(),
        )
        for _ in range(self.jobs - 1):
            try:
                self._helpers.append(_Helper(hello))
            except (OSError, ValueError):  # no process can be started here: check alone
                break

    def _collect(self, h: _Helper, batches: deque[Batch] | _Lazy) -> Iterator[Findings]:
        """The answers ``h`` has ready, then as many batches as it may hold."""
        if not h.ready:
            if not h.readable():
                return
            ready = self._ready.decode(h.receive())
            if ready.error:
                raise _Gone(ready.error)
            h.ready = True
        while h.held and h.readable():
            found = self._findings.decode(h.receive())
            h.held.popleft()
            if not h.answered:
                self.helped += 1
            h.answered += 1
            yield found
        while batches and len(h.held) < _IN_FLIGHT:
            h.send(batches.pop())

    def _wait(self, batches: deque[Batch] | _Lazy) -> None:
        """Nothing left to check here: wait for a helper's answer; drop the helpers that
        died meanwhile (their batches come back to ``batches``)."""
        busy = [h for h in self._helpers if h.held]
        if select.select([h.out for h in busy], [], [], 1.0)[0]:
            return
        for h in busy:
            if h.proc.poll() is not None:
                self._drop(h, batches, f"it exited with status {h.proc.returncode}")

    def _drop(self, h: _Helper, batches: deque[Batch] | _Lazy, why: str) -> None:
        """Stop using ``h``; the batches it held go back to be checked here. Logged: the
        answer is whole, but the check is slower than it should be."""
        self._helpers.remove(h)
        held = len(h.held)
        batches.extend(h.held)
        h.held.clear()
        h.close(kill=True)
        _log.warning(
            "check helper (pid %d) dropped, %d batch(es) it held checked here instead: %s%s",
            h.proc.pid,
            held,
            why,
            f"\n{h.last_words}" if h.last_words else "",
        )


# -- the helper's side ---------------------------------------------------------------------
def _serve(inp: int, out: int) -> int:
    def send(body: bytes) -> None:
        _write_all(out, _frame(body))

    try:
        hello = msgspec.msgpack.decode(_read_frame(inp), type=Hello)
    except (_Gone, msgspec.DecodeError):
        return 2
    for name in hello.modules:
        with contextlib.suppress(Exception):  # a kind not known here is read more slowly
            importlib.import_module(name)
    from medomni_cas.store.url import open_backend

    try:
        module, _, name = hello.backend.partition(":")
        cls = getattr(importlib.import_module(module), name)
        backend = open_backend(hello.url, create=False, cls=cls)
    except Exception as e:
        send(msgspec.msgpack.encode(Ready(f"cannot open {hello.url}: {e}")))
        return 1
    encode = msgspec.msgpack.Encoder(enc_hook=bytes).encode  # ObjectId is a bytes subclass
    check = BatchChecker(hello.canonical, hello.exact)
    send(msgspec.msgpack.encode(Ready()))
    served = 0
    try:
        while True:
            try:
                body = _read_frame(inp)
            except _Gone:
                return 0  # stdin closed: the walk is over
            keys = [body[i : i + ID_SIZE] for i in range(0, len(body), ID_SIZE)]
            found = merged([check(part, got) for part, got in backend.get_parts(keys, HELD_BYTES)])
            served += 1
            found.links = list(set(found.links))  # the walk needs each link once
            send(encode(found))
    finally:
        backend.close()


def main() -> int:
    # frames go to the original stdout; anything printed by an import goes to stderr
    out = os.dup(1)
    os.dup2(2, 1)
    try:
        return _serve(0, out)
    except BrokenPipeError:
        return 0  # the walk ended (or was killed) while this helper answered


if __name__ == "__main__":
    code = main()
    # nothing to flush or tidy (the store is closed, frames are written unbuffered), and the
    # walk waits for this exit: skip the interpreter's teardown of every module
    os._exit(code)
