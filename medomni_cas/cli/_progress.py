"""Progress bars on stderr for work that takes more than a moment (tqdm; silent when
stderr is not a terminal or under ``--json``, so pipes and logs stay clean)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from medomni_cas.cli._output import json_mode

if TYPE_CHECKING:
    from medomni_cas.porcelain import Progress

__all__ = ["bar", "bars"]


def _options(args: argparse.Namespace) -> dict[str, Any]:
    # bars appear only after half a second (``delay``), on a terminal, and leave no line
    quiet = json_mode(args) or not sys.stderr.isatty()
    return {"delay": 0.5, "disable": quiet, "file": sys.stderr, "leave": False}


def bars(args: argparse.Namespace) -> Progress:
    """The porcelain's ``progress=``: tqdm bars on stderr, shown as `bar` shows them."""
    return functools.partial(tqdm, **_options(args))


@contextmanager
def bar(args: argparse.Namespace, total: int | None, unit: str, desc: str = "") -> Iterator[tqdm]:
    """One bar of `bars`, closed on leaving."""
    with tqdm(total=total, unit=unit, desc=desc, **_options(args)) as b:
        yield b
