"""The `medomni` entry point: one argparse subcommand group per module.

A group is a module with ``register(subparsers)`` that adds its parser and verbs (see
`medomni_cas.cli.cas`); adding one is one line in `GROUPS`. Each verb sets a ``handler``
default, ``handler(args) -> exit code``, which only parses, calls the porcelain
(`medomni_cas.porcelain`, or the store's own API for ``cas``) and prints.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Sequence

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
    "medomni_cas.cli.view",
    "medomni_cas.cli.keys",
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
    _describe(parser, top=True)
    return parser


def _verbs(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, str]]:
    """(``taskset build``, its one-line help) for every command under ``parser``."""
    verbs = _verbs(parser)
    if verbs is None:
        return
    helps = {a.dest: a.help or "" for a in verbs._choices_actions}
    for name, sub in verbs.choices.items():
        if _verbs(sub) is None:
            yield f"{path}{name}", helps.get(name, "")
        else:
            yield from _commands(sub, f"{path}{name} ")


def _describe(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Give each group's help screen its one-line help as a description and, when it holds
    groups of its own (``studio task|taskset|template``), every command under it with its
    help, so ``medomni studio --help`` says what each command does."""
    verbs = _verbs(parser)
    if verbs is None:
        return
    helps = {a.dest: a.help for a in verbs._choices_actions}
    nested = False
    for name, sub in verbs.choices.items():
        if _verbs(sub) is not None:
            nested = True
            if sub.description is None:
                sub.description = helps.get(name)
            _describe(sub)
    if nested and not top:
        rows = list(_commands(parser))
        width = max(len(c) for c, _ in rows) + 2
        parser.epilog = "commands:\n" + "\n".join(f"  {c:<{width}}{h}" for c, h in rows)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


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
