"""The CLI for tests: in a fresh process where one is the point (signals, kills, crashes,
rlimits, mounts, a process's own environment), else in this one, as that process would run.

`medomni` starts an interpreter (a second or more of start-up and imports on a loaded
machine); `medomni_here` runs the same entry point here and returns what that process would
have: its exit code, stdout and stderr, with an uncaught exception as exit 1 and its
traceback on stderr, as the interpreter prints it.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["medomni", "medomni_here"]

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


@contextlib.contextmanager
def _environment(cwd: Path, env: Mapping[str, str] | None) -> Iterator[None]:
    before, saved = os.getcwd(), {k: os.environ.get(k) for k in env or {}}
    os.chdir(cwd)
    os.environ.update(env or {})
    try:
        yield
    finally:
        os.chdir(before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def medomni_here(
    *argv: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``medomni ARGV`` in this process, from ``cwd``, with ``env`` over this environment:
    what `medomni` returns, without starting an interpreter."""
    from medomni_cas.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with _environment(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:
            err.write(traceback.format_exc())  # "Traceback (most recent call last): ..."
            code = 1
    return subprocess.CompletedProcess(["medomni", *argv], code, out.getvalue(), err.getvalue())
