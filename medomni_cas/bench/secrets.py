"""Secrets kept out of the store: what a run's logs, errors and answer must never hold.

An agent config names the variables holding secrets (``settings.secrets``; a variable of
``settings.env`` whose name says KEY, TOKEN, SECRET or PASSWORD counts too). Before a trial
is recorded (`medomni_cas.bench.recording.record_trial`), every value of those variables is
replaced in its logs, errors, answer and reported model by ``[redacted:<NAME>]``, and so is
any bearer token (``Bearer <token>``), whoever's it is. What is never stored cannot reach a
log blob, a run folder (a view of the records), a bundle or a push.

Runners that keep files of their own in the run folder (the Harbor runner's trial folders)
redact them with `Redactor.folder`, and so are scratch folders kept for debugging
(`medomni_cas.bench.scratch`, the process runner's ``keep=1``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from medomni_cas.bench.records import AgentConfig
from medomni_cas.bench.runners import Trial

__all__ = ["Redactor", "redactor", "secret_names"]

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_BEARER = re.compile(rb"(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_MIN_LEN = 6  # shorter values would redact ordinary words; no real key is that short
_MAX_FILE = 256 << 20  # a kept file larger than this is removed, not read whole


def secret_names(agent: AgentConfig) -> list[str]:
    """The variables whose values ``agent``'s runs must never store."""
    names = [n for n in agent.options.get("secrets") or () if isinstance(n, str)]
    names += [n for n in agent.options.get("env") or () if isinstance(n, str)]
    named = set(agent.options.get("secrets") or ())
    return list(dict.fromkeys(n for n in names if n in named or _SECRET_NAME.search(n)))


@dataclass(frozen=True)
class Redactor:
    """Replaces known secret values (name -> value) and bearer tokens in bytes and text."""

    values: tuple[tuple[str, bytes], ...] = ()

    def clean(self, data: bytes) -> bytes:
        for name, value in self.values:
            if value in data:
                data = data.replace(value, b"[redacted:" + name.encode() + b"]")
        if b"earer" in data:
            data = _BEARER.sub(rb"\1[redacted]", data)
        return data

    def clean_text(self, text: str) -> str:
        return self.clean(text.encode()).decode(errors="replace")

    def trial(self, trial: Trial) -> Trial:
        """``trial`` with its logs, errors, answer and served model redacted, in place."""
        trial.logs = {n: self.clean(b) for n, b in trial.logs.items()}
        trial.errors = [self.clean_text(e) for e in trial.errors]
        if trial.answer is not None:
            trial.answer = self.clean(trial.answer)
        trial.served_model = self.clean_text(trial.served_model)
        return trial

    def folder(self, root: Path) -> int:
        """Redact every regular file under ``root`` in place; how many changed.

        The files may be an agent's, made to resist: a folder or file it made unreadable
        is made ours again first (it ran as us), and a file that still cannot be read and
        rewritten, or is too large to read whole, is removed rather than kept unredacted.
        Symbolic links are left as they are (they hold a path, not the bytes)."""
        changed = 0
        if not root.is_dir() or root.is_symlink():
            return changed
        _own(root, 0o700)
        for top, dirs, files in os.walk(root):
            for d in dirs:
                path = Path(top, d)
                if not path.is_symlink():
                    _own(path, 0o700)  # before os.walk lists it
            for f in files:
                path = Path(top, f)
                if path.is_symlink() or not path.is_file():
                    continue
                try:
                    changed += self._file(path)
                except OSError:
                    with contextlib.suppress(OSError):
                        path.unlink()
                    changed += 1
        return changed

    def _file(self, path: Path) -> int:
        st = path.lstat()
        if st.st_nlink == 1:  # a hard link's mode is the other file's too: left as it is
            _own(path, 0o600)
        if st.st_size > _MAX_FILE:
            raise OSError(f"{path}: too large to redact")
        data = path.read_bytes()
        redacted = self.clean(data)
        if redacted == data:
            return 0
        # a new file renamed over the old: a hard link the agent made to a file elsewhere
        # keeps that file's bytes as they are
        tmp = path.with_name(f".{path.name}.redacted")
        tmp.write_bytes(redacted)
        os.replace(tmp, path)
        return 1


def _own(path: Path, mode: int) -> None:
    """Give us read and write (and search, for a folder) on ``path``, if it lacks them."""
    with contextlib.suppress(OSError):
        if path.stat().st_mode & mode != mode:
            os.chmod(path, path.stat().st_mode | mode)


def redactor(agent: AgentConfig, environ: Mapping[str, str] | None = None) -> Redactor:
    """The `Redactor` of ``agent``'s secrets, with their values as set now."""
    env = os.environ if environ is None else environ
    values = []
    for name in secret_names(agent):
        value = env.get(name, "")
        if len(value) >= _MIN_LEN:
            values.append((name, value.encode()))
    # the longest first: a key that holds another is replaced whole
    values.sort(key=lambda nv: -len(nv[1]))
    return Redactor(tuple(values))
