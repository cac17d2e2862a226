"""Ed25519 signing keys in PEM: make a pair, read either half, name a public key by its keyid.

Files
    ``PATH`` holds the private key as unencrypted PKCS#8 PEM (mode 0600), ``PATH.pub`` the
    public key as SubjectPublicKeyInfo PEM: what ``openssl genpkey -algorithm ed25519``
    writes, and what securesystemslib and the in-toto tools read.
keyid
    The lowercase hex SHA-256 of the public key's DER SubjectPublicKeyInfo (the bytes inside
    the ``.pub`` file's PEM armour). It names the key in a DSSE signature (``keyid``) and in
    the ref ``attestations/<set>/<keyid>``; anyone can compute it from the public key with
    ``openssl pkey -pubin -in PATH.pub -outform DER | sha256sum``.

`cryptography` is the ``attest`` extra, imported when a key is first used.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from medomni_cas._extras import require
from medomni_cas.errors import MedomniError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "KeyFileError",
    "KeyPair",
    "generate",
    "keyid",
    "load_private",
    "load_public",
    "public_pem",
    "write_pair",
]

_PURPOSE = "signed attestations"


class KeyFileError(MedomniError, ValueError):
    """A key file that cannot be used: missing, not PEM, not Ed25519, or in the way."""


def _crypto() -> tuple[ModuleType, ModuleType]:
    serialization = require("cryptography.hazmat.primitives.serialization", "attest", _PURPOSE)
    ed25519 = require("cryptography.hazmat.primitives.asymmetric.ed25519", "attest", _PURPOSE)
    return serialization, ed25519


def generate() -> Ed25519PrivateKey:
    """A fresh Ed25519 private key."""
    _, ed25519 = _crypto()
    key: Ed25519PrivateKey = ed25519.Ed25519PrivateKey.generate()
    return key


def _spki_der(public: Ed25519PublicKey) -> bytes:
    serialization, _ = _crypto()
    s = serialization
    return public.public_bytes(
        encoding=s.Encoding.DER,
        format=s.PublicFormat.SubjectPublicKeyInfo,
    )


def keyid(public: Ed25519PublicKey) -> str:
    """The key's id: hex SHA-256 of its DER SubjectPublicKeyInfo (see the module docstring)."""
    return hashlib.sha256(_spki_der(public)).hexdigest()


def public_pem(public: Ed25519PublicKey) -> bytes:
    serialization, _ = _crypto()
    s = serialization
    return public.public_bytes(
        encoding=s.Encoding.PEM,
        format=s.PublicFormat.SubjectPublicKeyInfo,
    )


def _private_pem(private: Ed25519PrivateKey) -> bytes:
    serialization, _ = _crypto()
    s = serialization
    return private.private_bytes(
        encoding=s.Encoding.PEM,
        format=s.PrivateFormat.PKCS8,
        encryption_algorithm=s.NoEncryption(),
    )


@dataclass(frozen=True)
class KeyPair:
    """What `write_pair` wrote: the two files and the keyid."""

    private: Path
    public: Path
    keyid: str


def write_pair(path: str | os.PathLike[str], *, force: bool = False) -> KeyPair:
    """Make a key pair: ``path`` (private, PKCS#8 PEM, mode 0600) and ``path.pub``.

    Refuses to overwrite either file unless ``force``; the private key is created with mode
    0600 from the start (never readable by others, even for a moment)."""
    priv = Path(path)
    pub = priv.with_name(priv.name + ".pub")
    if not force:
        for p in (priv, pub):
            if p.exists():
                raise KeyFileError(f"{p} exists: give another path, or --force to replace it")
    key = generate()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if force else os.O_EXCL)
    fd = os.open(priv, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # a file replaced under --force keeps no looser mode
        f.write(_private_pem(key))
    pub.write_bytes(public_pem(key.public_key()))
    return KeyPair(priv, pub, keyid(key.public_key()))


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"{os.fspath(path)}: no such key file") from None


def load_private(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PKCS#8 PEM, unencrypted)."""
    serialization, ed25519 = _crypto()
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{os.fspath(path)}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise KeyFileError(f"{os.fspath(path)}: a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path`` (SubjectPublicKeyInfo PEM). A private key file is
    accepted too (its public half), so one file can both sign and check."""
    serialization, ed25519 = _crypto()
    data = _read(path)
    if b"PRIVATE KEY" in data:
        return load_private(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{os.fspath(path)}: not a PEM public key ({e})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise KeyFileError(f"{os.fspath(path)}: a {type(key).__name__}, not an Ed25519 key")
    return key
