"""``medomni keygen -o PATH``: an Ed25519 key pair for signing attestations.

Writes ``PATH`` (the private key, PKCS#8 PEM, mode 0600) and ``PATH.pub`` (the public key,
SubjectPublicKeyInfo PEM), refusing to overwrite either unless ``--force``, and prints the
keyid (`medomni_cas.audit.keys`).
"""

from __future__ import annotations

import argparse

from medomni_cas import porcelain
from medomni_cas.cli._output import EXIT_OK, common_options, emit

__all__ = ["register"]


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a key pair and print its keyid."""
    pair = porcelain.keygen(args.output, force=args.force)
    data = {"private": str(pair.private), "public": str(pair.public), "keyid": pair.keyid}
    emit(args, data, f"wrote {pair.private} (private, 0600) and {pair.public}; keyid {pair.keyid}")
    return EXIT_OK


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keygen`` to the top-level subcommands."""
    help = "make an Ed25519 key pair for signing attestations"
    p = groups.add_parser("keygen", help=help, description=help, parents=[common_options()])
    p.set_defaults(handler=cmd_keygen, parser=p)
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="the private key file")
    p.add_argument("--force", action="store_true", help="replace PATH and PATH.pub if they exist")
