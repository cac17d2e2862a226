"""`RefFiles`: refs on a filesystem, made atomic by two conditional writes.

Layout under the root::

    refs/<name>             "<hex id or ->\\n<seq>\\n": the ref and the number of its updates
    logs/<name>/<seq:020d>  update number seq: "<new hex id or ->\\n" + the history entry
    names/~<hash>           the full name of a ref whose encoded name is too long

Ref names are percent-encoded into one flat key (`.._layout.encode_ref_name`), so that
``a`` and ``a/b`` coexist even on filesystems with real folders.

The atomic step. Update number ``seq + 1`` of a ref at ``seq`` is decided by creating
``logs/<name>/<seq+1>`` create-only (``If-None-Match: *``): exactly one writer succeeds,
and from then on the update is committed. The ref object then moves to ``(new, seq + 1)``
with ``If-Match`` on the ETag it was read with. Any writer that finds entry ``seq + 1``
present while the ref is still at ``seq`` rolls the ref forward to that entry's value
first, so a writer killed between the two writes loses nothing and blocks no one.

An entry chained to its predecessor (`medomni_cas.store.backend.Entry` as a function) is
made from entry ``seq``, read once per round: entry ``seq`` never changes once the ref is
at ``seq``, and only one writer creates ``seq + 1``, so no two entries link the same one.

Readers of the ref alone may see the value before such an unfinished update until the
next writer completes it. The log entry is read only when the ref differs from the
expected value or the create loses, so a successful update costs three requests (read,
create, move); the entry of an update this process made is not read back to chain the
next one to it (a claim's release). Without conditional writes the same steps run with
plain writes, which is safe only for a single writer (the store enforces that).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from medomni_cas.store.backend import Entry
from medomni_cas.store.backends._layout import decode_ref_name, encode_ref_name
from medomni_cas.store.backends.fsspec._remote import Remote

__all__ = ["MAX_ROUNDS", "RefFiles"]

# Each round of a ref update means another writer made progress; give up after this many.
MAX_ROUNDS = 1000
_MADE_LIMIT = 4096  # history entries of our own kept for chaining (a claim's release)
_TOMBSTONE = b"-"
_LIST_FROM = 4  # refs asked at once from which a listing first pays
_PAGE = 1000  # keys per listing page (S3)


def _dump_ref(value: bytes | None, seq: int) -> bytes:
    head = _TOMBSTONE if value is None else value.hex().encode()
    return head + b"\n%d\n" % seq


def _parse_value(line: bytes, where: str) -> bytes | None:
    if line == _TOMBSTONE:
        return None
    try:
        return bytes.fromhex(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{where}: expected a hex id or '-', got {line[:80]!r}") from None


def _parse_ref(data: bytes, where: str) -> tuple[bytes | None, int]:
    """A ref file's value and update count."""
    lines = data.split(b"\n")
    try:
        seq = int(lines[1]) if len(lines) > 1 and lines[1] else 0
    except ValueError:
        raise ValueError(f"{where}: not a ref object (bad update count)") from None
    return _parse_value(lines[0], where), seq


class RefFiles:
    """The refs and their histories under one root (see the module docstring)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        # history entries this process created, by (encoded name, seq): create-only, so
        # never changed; the next update of the ref chains to one without reading it back
        self._made: dict[tuple[str, int], bytes] = {}

    # -- paths -----------------------------------------------------------------------------
    def ref_path(self, encoded: str) -> str:
        """The ref file of an encoded name."""
        return self.remote.path("refs", encoded)

    def log_path(self, encoded: str, seq: int) -> str:
        """The history entry of update ``seq`` of an encoded name."""
        return self.remote.path("logs", encoded, f"{seq:020d}")

    def _name_of(self, encoded: str) -> str | None:
        name = decode_ref_name(encoded)
        if name is None:
            data = self.remote.cat(self.remote.path("names", encoded))
            return None if data is None else data.decode()
        return name

    # -- reading ---------------------------------------------------------------------------
    def _read(self, encoded: str) -> tuple[bytes | None, int, str | None]:
        """The ref's value, update count and ETag (None when conditional writes are off)."""
        path = self.ref_path(encoded)
        data, etag = self.remote.read_versioned(path)
        if data is None:
            return None, 0, None
        return (*_parse_ref(data, path), etag)

    def get(self, name: str) -> bytes | None:
        """The id ref ``name`` points to, or None."""
        return self._read(encode_ref_name(name))[0]

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        """Each ref's value, in order (the reads in flight together where they can be)."""
        paths = [self.ref_path(encode_ref_name(name)) for name in names]
        out: list[bytes | None] = []
        for name, path, res in zip(
            names, paths, self.remote.read_versioned_many(paths), strict=True
        ):
            if isinstance(res, BaseException):
                raise OSError(f"{self.remote.url}: reading ref {name!r} failed: {res}") from res
            data = res[0]
            out.append(None if data is None else _parse_ref(data, path)[0])
        return out

    def get_prefixed(self, prefix: str, ids: Sequence[bytes]) -> list[bytes | None]:
        """`get_many` of ``prefix + id.hex()`` for each of ``ids``. For many ids, a listing
        of the names under ``prefix`` first (a page per 1,000 refs, when it takes no more
        pages than a thousandth of the ids), then only the refs that exist are read: a
        resume check of slots never run costs a listing, not a request per slot."""
        names = [prefix + raw.hex() for raw in ids]
        if len(names) >= _LIST_FROM:
            encoded = encode_ref_name(prefix)
            first = encode_ref_name(names[0])
            if not first.startswith("~") and first.startswith(encoded):  # names not hashed
                listed = self.remote.names_starting(self.ref_path(encoded), len(names) // _PAGE + 1)
                if listed is not None:
                    ask = [n for n in names if self.ref_path(encode_ref_name(n)) in listed]
                    got = dict(zip(ask, self.get_many(ask), strict=True))
                    return [got.get(n) for n in names]
        return self.get_many(names)

    def iter(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """Every ``(name, id)`` whose name starts with ``prefix``, sorted by name."""
        named = []
        for path in self.remote.list(self.remote.path("refs")):
            name = self._name_of(path.rsplit("/", 1)[-1])
            if name is not None and name.startswith(prefix):
                named.append((name, path))
        named.sort()
        if not named:
            return
        got = self.remote.cat_whole([p for _, p in named])
        for (name, path), data in zip(named, got, strict=True):
            if isinstance(data, bytes):
                value = _parse_value(data.split(b"\n", 1)[0], path)
                if value is not None:
                    yield name, value
            elif not isinstance(data, FileNotFoundError):
                raise OSError(f"{self.remote.url}: reading ref {name!r} failed: {data}") from data

    def log(self, name: str) -> list[bytes]:
        """The history entries of ref ``name``, oldest first."""
        paths = sorted(self.remote.list(self.remote.path("logs", encode_ref_name(name))))
        if not paths:
            return []
        out = []
        for data in self.remote.cat_whole(paths):
            if isinstance(data, bytes):
                out.append(data.split(b"\n", 1)[1] if b"\n" in data else b"")
            elif not isinstance(data, FileNotFoundError):
                raise OSError(
                    f"{self.remote.url}: reading history of {name!r} failed: {data}"
                ) from data
        return out

    def log_names(self) -> Iterator[str]:
        """Every name that has a history, sorted."""
        names = (self._name_of(n) for n in self.remote.child_names(self.remote.path("logs")))
        yield from sorted(n for n in names if n is not None)

    # -- the atomic update -----------------------------------------------------------------
    def update(self, name: str, old: bytes | None, new: bytes | None, entry: Entry) -> bool:
        """If ref ``name`` is ``old``, set it to ``new`` and log ``entry`` (see above)."""
        encoded = encode_ref_name(name)
        if encoded.startswith("~"):
            self.remote.pipe(self.remote.path("names", encoded), name.encode())
        head = (_TOMBSTONE if new is None else bytes(new).hex().encode()) + b"\n"
        for _ in range(MAX_ROUNDS):
            value, seq, etag = self._read(encoded)
            made = self._entry(encoded, seq, entry) if value == old else b""
            if value == old and self.remote.create(self.log_path(encoded, seq + 1), head + made):
                if len(self._made) >= _MADE_LIMIT:
                    self._made.clear()
                self._made[(encoded, seq + 1)] = made
                self._move(name, encoded, etag, None if new is None else bytes(new), seq + 1)
                return True
            # the ref differs, or update seq + 1 was decided by another writer: an update
            # decided but not moved yet (its writer may be dead) is rolled forward first
            pending = self.remote.cat(self.log_path(encoded, seq + 1))
            if pending is not None:
                target = _parse_value(pending.split(b"\n", 1)[0], self.log_path(encoded, seq + 1))
                self._move(name, encoded, etag, target, seq + 1)
                continue
            if value != old:
                return False
        return False  # every round, another writer got there first

    def _entry(self, encoded: str, seq: int, entry: Entry) -> bytes:
        """The bytes of ``entry`` as update ``seq + 1``: linked to entry ``seq`` if chained."""
        if isinstance(entry, bytes):
            return entry
        if seq == 0:
            return entry(None)
        mine = self._made.get((encoded, seq))
        if mine is not None:
            return entry(mine)
        path = self.log_path(encoded, seq)
        data = self.remote.cat(path)
        # a lost entry is a damaged history, which fsck reports: it must not block the ref
        return entry(data.split(b"\n", 1)[1] if data and b"\n" in data else None)

    def _move(
        self, name: str, encoded: str, etag: str | None, value: bytes | None, seq: int
    ) -> None:
        """Move the ref from update ``seq - 1`` to ``seq`` (a no-op if someone else did)."""
        data = _dump_ref(value, seq)
        path = self.ref_path(encoded)
        for _ in range(MAX_ROUNDS):
            if self.remote.replace(path, data, etag):
                return
            _, current, etag = self._read(encoded)
            if current >= seq:
                return  # another writer rolled it forward
            if current != seq - 1:
                raise RuntimeError(
                    f"{path}: ref {name!r} is at update {current}, expected {seq - 1}; "
                    f"its history under {self.remote.path('logs', encoded)} is inconsistent"
                )
        raise RuntimeError(f"{path}: ref {name!r} could not be moved to update {seq}")
