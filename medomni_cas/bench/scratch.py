"""Private scratch folders for trials, under the workspace's scratch folder (``runs/.scratch``).

Layout
------
::

    runs/.scratch/              mode 0700
      <owner>.lock              held (flock) by the harness process that owns <owner>/
      <owner>/                  mode 0700, one per runner process
        <trial>/                mode 0700, one per trial, removed when it is recorded
      kept-<owner>/             what ``keep`` kept; never swept

A kept folder holds what an agent wrote (its logs, its tmp files), so it is passed through
``redact`` (the agent config's `medomni_cas.bench.secrets.Redactor.folder`) as each trial
ends and again when the owner closes: what is kept holds no secret the store would not.

Names are 128 random bits, so no other process can guess a trial's folder. The lock is
what says the owner lives: the kernel releases it when the owner process dies however it
died (SIGKILL, a crash, a power cut of a lock-holding host), so `sweep` removes exactly
what dead harnesses left, and never a folder of a harness still running, on this host or
any other sharing the folder through a file system whose locks are shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["SCRATCH_FOLDER", "Scratch", "sweep"]

#: The scratch folder's name in the runs folder.
SCRATCH_FOLDER = ".scratch"
_LOCK = ".lock"
_NEW = ".lock.new"
_KEPT = "kept-"
_STALE_NEW_SEC = 60.0  # a lock never renamed into place (its maker died on the way)


def _private(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask, and exist_ok keeps an old mode


def _free(lock: Path) -> bool:
    """Whether no live process holds ``lock`` (False if it vanished: someone else swept it)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases our lock too


def sweep(root: Path) -> list[Path]:
    """Remove the folders of dead owners under ``root``; the folders removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return removed
    names = {e.name for e in entries}
    now = time.time()
    for e in entries:
        if e.name.endswith(_LOCK) and _free(Path(e.path)):
            owner = root / e.name.removesuffix(_LOCK)
            shutil.rmtree(owner, ignore_errors=True)  # folder first: a lock never outlives it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
            removed.append(owner)
        elif e.name.endswith(_NEW):
            with contextlib.suppress(OSError):
                if now - e.stat().st_mtime > _STALE_NEW_SEC and _free(Path(e.path)):
                    os.unlink(e.path)
        elif (
            e.is_dir(follow_symlinks=False)
            and not e.name.startswith(_KEPT)
            and e.name + _LOCK not in names
        ):
            # an owner's folder is made after its lock and removed before it: with no lock,
            # it is what a sweep interrupted half way left
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(Path(e.path))
    return removed


class Scratch:
    """One runner process's folder under ``root``: swept on entry, holding trial folders.

    ``keep`` keeps the trial folders (renamed ``kept-<owner>/`` on close) for debugging,
    each passed through ``redact`` first.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep: bool = False,
        redact: Callable[[Path], object] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.keep = keep
        self.redact = redact
        _private(self.root)
        self.swept = sweep(self.root)
        name = secrets.token_hex(16)
        # locked under a temporary name, then renamed into place: a sweep never sees the
        # lock of a live owner unlocked
        new = self.root / f"{name}{_NEW}"
        self._fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.write(self._fd, f"{os.uname().nodename} {os.getpid()}\n".encode())
        os.rename(new, self.root / f"{name}{_LOCK}")
        self.folder = self.root / name
        _private(self.folder)

    def trial(self) -> Path:
        """A new private folder for one trial."""
        path = self.folder / secrets.token_hex(16)
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
        return path

    def remove(self, path: Path) -> None:
        """Remove a trial's folder (unless kept: then redact it)."""
        if not self.keep:
            shutil.rmtree(path, ignore_errors=True)
        elif self.redact is not None:
            self.redact(path)

    def close(self) -> None:
        """Remove (or keep) this owner's folder and release its lock."""
        if self._fd < 0:
            return
        if self.keep:
            if self.redact is not None:
                self.redact(self.folder)  # trials never passed to `remove` too
            with contextlib.suppress(OSError):
                os.rename(self.folder, self.root / f"{_KEPT}{self.folder.name}")
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / f"{self.folder.name}{_LOCK}")
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
