"""Ref history entries, hash-chained, and the check that a ref agrees with its history.

Each update of a ref appends one `RefLogEntry`. Its ``chain`` field is the BLAKE3 hash (the
store's one hash function; on inputs this small, 0.4 us slower than hashlib's BLAKE2b, next
to a ref update's ~200 us on LMDB) of the ref's name, a zero byte, the previous entry's stored
bytes (4-byte big-endian length first; ``ff ff ff ff`` for the first entry) and the entry's
own bytes without ``chain``. The backend makes it inside its atomic step
(`Backend.ref_update` passes the previous entry's bytes to `chained`), so that concurrent
writers cannot link the same predecessor. A flipped bit in any entry, an entry dropped,
inserted or moved, a history moved to another ref's name: each breaks a link that
`check_history` recomputes.

Entries written before the chain existed have no ``chain``; their bytes are unchanged (the
field defaults to None and defaults are omitted). A history may start with such entries:
the chain starts at the first linked entry, which covers the bytes of the one before it,
and every later entry must be linked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import blake3
import msgspec

from medomni_cas.store.encoding import Part
from medomni_cas.store.ids import ObjectId

__all__ = ["RefLogEntry", "chained", "check_history", "decode_entry", "encode_entry"]


class RefLogEntry(Part, frozen=True, kw_only=True):
    """One update of a ref: what it was, what it became, when and why.

    ``forced``: a person overrode the ref's update policies (or a sync's fast-forward
    rule), saying why in ``message``. ``chain``: the link to the previous entry (see the
    module docstring); None in entries written before the chain existed."""

    old: bytes | None = None
    new: bytes | None = None
    time: float
    message: str = ""
    forced: bool = False
    chain: bytes | None = None

    def __repr__(self) -> str:
        def show(raw: bytes | None) -> str:
            return "-" if raw is None else raw.hex()[:12]

        forced = ", forced" if self.forced else ""
        return (
            f"RefLogEntry({show(self.old)} -> {show(self.new)}, "
            f"time={self.time:.3f}, message={self.message!r}{forced})"
        )

    @property
    def old_id(self) -> ObjectId | None:
        return None if self.old is None else ObjectId(self.old)

    @property
    def new_id(self) -> ObjectId | None:
        return None if self.new is None else ObjectId(self.new)


_ENC = msgspec.msgpack.Encoder(order="sorted")
_DEC = msgspec.msgpack.Decoder(RefLogEntry)
_replace = msgspec.structs.replace

encode_entry: Callable[[RefLogEntry], bytes] = _ENC.encode
decode_entry: Callable[[bytes], RefLogEntry] = _DEC.decode


_FIRST = b"\xff" * 4  # the "previous entry" of a ref's first: no length is this long
# "chain" sorts first of the entry's keys, so an entry with it is the one without it with
# this key and value in front (and one more key in the map's header); see `chained`
_CHAIN_KEY = b"\xa5chain\xc4\x20"


def _link(head: bytes, previous: bytes | None, body: bytes) -> bytes:
    prev = _FIRST if previous is None else len(previous).to_bytes(4, "big") + previous
    return blake3.blake3(head + prev + body).digest()  # the store's one hash function


def chained(name: str, entry: RefLogEntry) -> Callable[[bytes | None], bytes]:
    """The bytes of ``entry`` (its chain unset) linked to the previous entry's bytes, as a
    function of them: what `Refs` hands `Backend.ref_update`. The bytes are those of
    ``encode_entry`` of the entry with its chain set, made by splicing (a ref update is on
    the hot path of runs); `check_history` re-encodes them, so a difference would show."""
    head = name.encode() + b"\x00"
    body = _ENC.encode(entry)
    size = body[0]
    if not 0x80 <= size < 0x8F or entry.chain is not None:  # not a small map: encode again
        return lambda previous: _ENC.encode(_replace(entry, chain=_link(head, previous, body)))
    start, rest = bytes((size + 1,)) + _CHAIN_KEY, body[1:]

    def link(previous: bytes | None) -> bytes:
        return start + _link(head, previous, body) + rest

    return link


def check_history(name: str, raws: Sequence[bytes], current: bytes | None) -> list[str]:
    """What is wrong with ref ``name``'s history ``raws`` (oldest first) given its value
    ``current`` (None: absent or deleted): an empty list when nothing is."""
    problems: list[str] = []
    where = f"ref {name}"
    if not raws:
        if current is not None:
            problems.append(f"{where} points to {current.hex()} but has no history")
        return problems
    head = name.encode() + b"\x00"
    linked = False
    previous: bytes | None = None
    prev_new: bytes | None = None
    known = False  # prev_new is the previous entry's new value (it decoded)
    for i, raw in enumerate(raws):
        at = f"{where}: history entry {i + 1} of {len(raws)}"
        try:
            entry = _DEC.decode(raw)
        except (msgspec.DecodeError, ValueError) as e:
            problems.append(f"{at} does not decode: {e}")
            previous, prev_new, known = raw, None, False
            continue
        if _ENC.encode(entry) != raw:
            problems.append(f"{at} is not in canonical form (its bytes were changed)")
        if entry.chain is not None:
            body = _ENC.encode(_replace(entry, chain=None))
            if entry.chain != _link(head, previous, body):
                problems.append(
                    f"{at} breaks the hash chain (it, the entry before it or the ref's name "
                    "was changed, or an entry was removed)"
                )
            linked = True
        elif linked:
            problems.append(
                f"{at} has no link to the entry before it, as every entry after the first "
                "linked one must"
            )
        if known and entry.old != prev_new:
            problems.append(
                f"{at} moves the ref from {_show(entry.old)}, but the entry before left it at "
                f"{_show(prev_new)}"
            )
        previous, prev_new, known = raw, entry.new, True
    if known and prev_new != current:
        problems.append(
            f"{where} is {_show(current)}, but its history's last entry set it to {_show(prev_new)}"
        )
    return problems


def _show(raw: bytes | None) -> str:
    return "(absent)" if raw is None else raw.hex()
