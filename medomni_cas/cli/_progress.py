"""Progress bars on stderr for work that takes more than a moment (tqdm; silent when
stderr is not a terminal or under ``--json``, so pipes and logs stay clean)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

from medomni_cas.cli._output import json_mode

__all__ = ["bar"]


@contextmanager
def bar(args: argparse.Namespace, total: int | None, unit: str, desc: str = "") -> Iterator[tqdm]:
    """A bar that appears only after half a second (``delay``), on a terminal."""
    quiet = json_mode(args) or not sys.stderr.isatty()
    with tqdm(
        total=total, unit=unit, desc=desc, delay=0.5, disable=quiet, file=sys.stderr, leave=False
    ) as b:
        yield b
