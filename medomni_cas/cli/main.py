"""The `medomni` entry point: one argparse subcommand group per module.

A group is a module with ``register(subparsers)`` that adds its parser and verbs (see
`medomni_cas.cli.cas`); adding one is one line in `GROUPS`. Each verb sets a ``handler``
default, ``handler(args) -> exit code``, which only parses and calls library functions.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from medomni_cas import __version__
from medomni_cas.cli import _output

__all__ = ["GROUPS", "build_parser", "main"]

#: Modules that each register one subcommand group.
GROUPS: tuple[str, ...] = (
    "medomni_cas.cli.cas",
    "medomni_cas.cli.studio",
    "medomni_cas.cli.bench",
    "medomni_cas.cli.audit",
    "medomni_cas.cli.plugins",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medomni",
        description="MedOmni's content-addressed store and tools.",
        parents=[_output.common_options()],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(handler=None, parser=parser)
    groups = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in GROUPS:
        importlib.import_module(name).register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``medomni ARGS``; return the exit code instead of exiting."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors (argparse uses 2)
        return e.code if isinstance(e.code, int) else _output.EXIT_BAD_INPUT
    if args.handler is None:
        # a group without a verb: show the help of the deepest parser reached
        args.parser.print_help(sys.stderr)
        return _output.EXIT_BAD_INPUT
    return _output.run(args.handler, args)


if __name__ == "__main__":
    sys.exit(main())
