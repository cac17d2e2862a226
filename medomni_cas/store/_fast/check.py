"""One batch of a closure check: re-hash what was read, and find the links to follow.

Every walk of `medomni_cas.store.verify` takes this step, and so do the helper processes of
its pool (`medomni_cas.store._fast.pool`), so that a batch is checked by the same code
wherever it runs. A batch's findings are data (`Findings`), never raised: the walk decides
how to report them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import partial
from itertools import compress
from typing import cast

import blake3
import msgspec

from medomni_cas.errors import InvalidObject
from medomni_cas.store import encoding
from medomni_cas.store._fast.groups import BatchReader
from medomni_cas.store.encoding import BLOB_PREFIX
from medomni_cas.store.ids import ID_SIZE, ObjectId

__all__ = ["BatchChecker", "Findings", "mismatches"]

_Ext = msgspec.msgpack.Ext
_wrap_id = partial(bytes.__new__, ObjectId)  # an id from 32 bytes (or a view of them)


class Findings(msgspec.Struct, array_like=True):
    """What checking one batch found.

    ``links`` are the links of its sound objects (repeats included, except from a helper,
    which sends each once); with owners, ``owners[k]`` is the index in ``sound`` of the
    object that holds ``links[k]``. Corrupt and malformed objects are not followed."""

    objects: int = 0  # objects read (the absent ones not counted)
    nbytes: int = 0
    absent: list[bytes] = []
    corrupt: list[tuple[bytes, str]] = []  # (id, what its bytes hash to, hex)
    malformed: list[tuple[bytes, str]] = []  # (id, what is wrong with it)
    links: list[bytes] = []
    owners: list[int] = []
    sound: list[bytes] = []  # with owners only: the ids that ``owners`` index


class BatchChecker:
    """Checks batches: bytes against ids, then links read exactly (`BatchReader.links`), or
    with ``canonical`` the canonical check too (`BatchReader.check`, and the full check for
    anything it doubts). Holds only what speeds up later batches (its reader's hint, the
    kinds already checked). ``exact``: by the definitions only (None: as the environment
    says, `medomni_cas.store._fast.exact`)."""

    def __init__(self, canonical: bool, exact: bool | None = None) -> None:
        self.canonical = canonical
        self.reader = BatchReader(exact)
        self.exact = self.reader.exact
        # kinds without a mirror: one decode whose link hook collects the links, one
        # re-encode; kinds (with versions) are admitted to it by passing the full check once
        self._kinds: set[tuple[str, int]] = set()
        self._found: list[ObjectId] = []
        self._decoder = msgspec.msgpack.Decoder(ext_hook=_noting_hook(self._found.append))

    def __call__(
        self, keys: list[bytes], got: list[bytes | None], *, owners: bool = False
    ) -> Findings:
        """Check the objects ``got`` for ``keys`` (None: not stored)."""
        out = Findings()
        datas = cast("list[bytes]", got)  # once the None are out, below
        if None in got:
            present = [data is not None for data in got]  # not truthiness: b"" is an object
            out.absent = list(compress(keys, map(operator.not_, present)))
            keys, datas = list(compress(keys, present)), list(compress(datas, present))
        out.objects = len(keys)
        out.nbytes = sum(map(len, datas))
        corrupt = mismatches(keys, datas)
        if corrupt:
            out.corrupt = [(keys[j], blake3.blake3(datas[j]).hexdigest()) for j in corrupt]
            keep = [True] * len(keys)
            for j in corrupt:
                keep[j] = False
            keys, datas = list(compress(keys, keep)), list(compress(datas, keep))
        if self.canonical:
            ids, own, doubtful = self.reader.check(datas, owners=owners)
            for j in doubtful:
                try:
                    links = self.checked_links(datas[j])
                except InvalidObject as e:
                    out.malformed.append((keys[j], str(e)))
                    continue
                ids += links
                if owners:
                    own += [j] * len(links)
        else:
            ids, own, errors = self.reader.links(datas, owners=owners)
            out.malformed = [(keys[j], str(e)) for j, e in errors.items()]
        out.links = ids
        if owners:
            out.owners, out.sound = own, keys
        return out

    def checked_links(self, data: bytes) -> list[ObjectId]:
        """The links of one object after the canonical check (`InvalidObject` saying what
        is wrong): by one decode for a kind already checked, else by the full check."""
        found = None if self.exact else self._fast_links(data)
        if found is not None:
            return found
        kind = encoding.validate_canonical(data)
        found = encoding.links(data)
        self._kinds.add(kind)
        return found

    def _fast_links(self, data: bytes) -> list[ObjectId] | None:
        """`encoding.validate_canonical` and `encoding.links` in one decode, for a blob or an
        object of a kind already seen; None when it needs the full check (which says why).

        A canonical object has string map keys only, so the links its decode meets are those
        `encoding.links` collects from the body's values and lists.
        """
        try:
            if data[: len(BLOB_PREFIX)] == BLOB_PREFIX:
                encoding.blob_data(data)
                return []
            self._found.clear()
            value = self._decoder.decode(data)
            if type(value) is not list or len(value) != 3:
                return None
            kind, version, body = value
            if type(kind) is not str or type(version) is not int:
                return None
            if (kind, version) not in self._kinds:
                return None
            if encoding.encode_object(kind, version, body) != data or encoding.too_deep(value):
                return None
            # what its reader checks (a record's class); links are Ext here, which a body
            # check that wants ids refuses: the full check then decides
            encoding.check_kind(kind, version, data, body)
        except (msgspec.DecodeError, InvalidObject, RecursionError):
            return None
        return list(dict.fromkeys(self._found))


def mismatches(keys: Sequence[bytes], datas: Sequence[bytes]) -> list[int]:
    """The indexes of the ``datas`` that do not hash to their key (none, almost always:
    then the whole check is two C-level passes and one list comparison)."""
    # one hasher, reset after each object: a new one per object costs a quarter more
    hasher = blake3.blake3()
    update, digest, reset = hasher.update, hasher.digest, hasher.reset
    digests: list[bytes] = []
    add = digests.append
    for data in datas:
        update(data)
        add(digest())
        reset()
    if digests == (keys if type(keys) is list else list(keys)):
        return []
    return [i for i, (d, k) in enumerate(zip(digests, keys, strict=True)) if d != k]


def _noting_hook(note: Callable[[ObjectId], None]) -> Callable[[int, memoryview], _Ext]:
    """The canonical decoder's extension hook, except that a link stays an `Ext` (which
    re-encodes as it was, without the encoder's hook) and its id is passed to ``note``."""
    link_ext, wrap, ext = encoding.LINK_EXT, _wrap_id, _Ext

    def hook(code: int, data: memoryview) -> _Ext:
        if code == link_ext and len(data) == ID_SIZE:
            oid = wrap(data)
            note(oid)
            return ext(code, oid)
        raise InvalidObject(f"unknown msgpack extension type {code} (length {len(data)})")

    return hook
