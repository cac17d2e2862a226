"""The CLI in a fresh process, for tests that need one (signals, exit codes, no shared state)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["medomni"]

_MAIN = "import sys; from medomni_cas.cli.main import main; sys.exit(main())"


def medomni(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``medomni ARGV`` in a fresh process, this environment (PYTHONPATH, AWS_*) passed on."""
    return subprocess.run(
        [sys.executable, "-c", _MAIN, *argv],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
