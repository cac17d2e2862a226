"""Object ids: 32-byte BLAKE3 digests of an object's canonical bytes, printed as lowercase hex."""

from __future__ import annotations

import re

import blake3

from medomni_cas.errors import InvalidId

__all__ = ["ID_SIZE", "MIN_PREFIX", "ObjectId", "hash_bytes", "id_from_digest", "parse_id"]

ID_SIZE = 32
MIN_PREFIX = 8
_HEX = re.compile(r"[0-9a-f]+\Z")


class ObjectId(bytes):
    """The id of an object, and, inside another object, a link to it.

    A bytes subclass so that backends use it directly as a key; the canonical encoder
    turns it into the link extension type, so a field typed ``ObjectId`` is a link.
    """

    __slots__ = ()

    def __new__(cls, raw: bytes) -> ObjectId:
        if len(raw) != ID_SIZE:
            raise InvalidId(f"an object id is {ID_SIZE} bytes, got {len(raw)}")
        return super().__new__(cls, raw)

    @classmethod
    def from_hex(cls, text: str) -> ObjectId:
        if len(text) != 2 * ID_SIZE or not _HEX.match(text):
            raise InvalidId(f"not a full object id (64 lowercase hex characters): {text!r}")
        return cls(bytes.fromhex(text))

    def __str__(self) -> str:
        return self.hex()

    def __repr__(self) -> str:
        return f"ObjectId({self.hex()})"

    @property
    def short(self) -> str:
        return self.hex()[:12]


def id_from_digest(digest: bytes) -> ObjectId:
    """An id from a fresh 32-byte BLAKE3 digest, skipping the length check (hot paths)."""
    return bytes.__new__(ObjectId, digest)


def hash_bytes(*parts: bytes | memoryview) -> ObjectId:
    """BLAKE3-256 of the concatenated parts, without concatenating them."""
    h = blake3.blake3()
    for p in parts:
        h.update(p)
    return ObjectId(h.digest())


def parse_id(text: str | bytes) -> ObjectId:
    """A full id from 64 hex characters or 32 raw bytes; anything else is `InvalidId`."""
    if isinstance(text, ObjectId):
        return text
    if isinstance(text, bytes):
        return ObjectId(text)
    if not isinstance(text, str):
        raise InvalidId(f"an object id must be a hex string, got {type(text).__name__}")
    return ObjectId.from_hex(text.strip())


def check_prefix(prefix: str) -> str:
    """A prefix usable for lookup: lowercase hex, at least `MIN_PREFIX` characters."""
    p = prefix.strip().lower()
    if not _HEX.match(p) or len(p) > 2 * ID_SIZE:
        raise InvalidId(f"not a hex id or id prefix: {prefix!r}")
    if len(p) < MIN_PREFIX:
        raise InvalidId(f"id prefix {prefix!r} is too short: give at least {MIN_PREFIX} characters")
    return p
