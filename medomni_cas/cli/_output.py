"""What every command shares: common options, JSON or text output, errors -> exit codes.

Exit codes: 0 ok; 1 the store has a problem (fsck found one, an object is corrupt);
2 bad input (unknown id or ref, bad name or URL, missing file), reported on stderr in one
line that names what is at fault; 2 too when the environment fails (a full disk or LMDB
map, a damaged database, a refused permission, an unreachable endpoint), in one line that
says what failed and that nothing was lost (`environment_failure`). Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import msgspec

from medomni_cas.errors import AmbiguousId, EnvironmentFailure, IntegrityError, MedomniError
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store

if TYPE_CHECKING:
    from medomni_cas.porcelain import Folders

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "Handler",
    "add_command",
    "common_options",
    "emit",
    "emit_json",
    "environment_failure",
    "isotime",
    "open_store",
    "run",
    "to_builtins",
    "workspace_folders",
]

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2
# 128 + SIGPIPE, what a shell reports for `medomni cas cat X | head`
EXIT_BROKEN_PIPE = 141

Handler = Callable[[argparse.Namespace], int]


def common_options() -> argparse.ArgumentParser:
    """A parent parser with the options every level accepts.

    Defaults are SUPPRESS so that an option given before the verb (``medomni --json cas
    fsck``) is not reset by the verb's own parser; read them with ``getattr(args, …)``.
    """
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="store URL (default: the store in ./workspace.yaml, else lmdb://./.medomni/store)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="machine-readable output on stdout",
    )
    p.add_argument(
        "--single-writer",
        action="store_true",
        default=argparse.SUPPRESS,
        help="allow ref updates on filesystems without conditional writes (you hold the "
        "only writer)",
    )
    return p


_COMMON = common_options()


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help: str,
) -> argparse.ArgumentParser:
    """Add a verb with the common options; ``handler(args) -> exit code`` runs it."""
    p = subparsers.add_parser(name, help=help, description=help, parents=[_COMMON])
    p.set_defaults(handler=handler)
    return p


def add_jobs_option(p: argparse.ArgumentParser) -> None:
    """``-j/--jobs N`` for verbs that re-hash many objects (None: one per core, up to 4)."""

    def jobs(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {value!r}")
        return n

    p.add_argument(
        "-j",
        "--jobs",
        type=jobs,
        default=None,
        metavar="N",
        help="processes that share the re-hashing of a big store (default: one per core, "
        "up to 4; 1: this process only)",
    )


def open_store(args: argparse.Namespace, *, create: bool = False) -> Store:
    """The store ``--store`` names, else the workspace's (its file checked). Only verbs that
    write pass ``create``: a mistyped --store must not make an empty store."""
    from medomni_cas.store.url import open_store as open_url
    from medomni_cas.workspace import load_workspace

    return open_url(
        getattr(args, "store", None) or load_workspace(".").store_url,
        single_writer=getattr(args, "single_writer", False),
        create=create,
    )


def workspace_folders() -> Folders:
    """The folders of the workspace in the current directory, read only when a verb is
    not given one by its flag (``--studio``, ``--bench``, ``--runs``)."""
    from medomni_cas.porcelain import Folders
    from medomni_cas.workspace import load_workspace

    return Folders(lambda: load_workspace("."), where="the workspace in .")


def json_mode(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


# -- JSON ----------------------------------------------------------------------------------------
def _enc_hook(obj: Any) -> Any:
    # ObjectId is a bytes subclass: without this msgspec would write base64
    if isinstance(obj, ObjectId):
        return obj.hex()
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise NotImplementedError(f"cannot show a {type(obj).__name__} as JSON")


# insertion order, so that "id" and "kind" lead and tree entries stay sorted by name
_JSON = msgspec.json.Encoder(enc_hook=_enc_hook)


def to_builtins(obj: Any) -> Any:
    """Dicts, lists and scalars for any report (Struct, dataclass, NamedTuple); ids as hex."""
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        obj = obj._asdict()
    return msgspec.to_builtins(obj, enc_hook=_enc_hook)


def encode_json(obj: Any, *, indent: int = 0) -> str:
    data = _JSON.encode(obj)
    if indent:
        data = msgspec.json.format(data, indent=indent)
    return data.decode()


def emit_json(obj: Any) -> None:
    sys.stdout.write(encode_json(obj) + "\n")


def emit(args: argparse.Namespace, data: Any, text: str | Iterable[str]) -> None:
    """Print ``data`` as JSON under ``--json``, else the lines of ``text``."""
    if json_mode(args):
        emit_json(data)
        return
    lines = [text] if isinstance(text, str) else text
    out = sys.stdout
    for line in lines:
        out.write(line + "\n")


def isotime(t: float) -> str:
    """An epoch time as ISO-8601 in UTC, to the millisecond (reflog entries can share a second)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


# -- errors -------------------------------------------------------------------------------------
def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return str(e) or type(e).__name__


def _fail(args: argparse.Namespace, e: BaseException, code: int) -> int:
    msg = _describe(e)
    sys.stderr.write(f"medomni: error: {msg}\n")
    if json_mode(args):
        err: dict[str, Any] = {"type": type(e).__name__, "message": msg}
        if isinstance(e, AmbiguousId):
            err["candidates"] = e.candidates
        emit_json({"error": err})
    return code


# errno values that say the machine, not the input, failed
_ENV_ERRNOS = frozenset(
    getattr(errno, n)
    for n in (
        "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "ENOMEM", "EMFILE", "ENFILE",
        "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EHOSTUNREACH", "ENETUNREACH",
        "ETIMEDOUT", "EPIPE",
    )
    if hasattr(errno, n)
)  # fmt: skip


def environment_failure(e: BaseException, store: str | None = None) -> EnvironmentFailure | None:
    """``e`` as an `EnvironmentFailure` when it is one of the environment (disk, database,
    permissions, network), else None; ``store`` (its URL) is named when the error does not.
    Third-party errors are known by their classes (LMDB), or their modules (botocore,
    aiohttp), so that no backend's package is imported here."""
    if isinstance(e, EnvironmentFailure):
        return e
    env = _environment(e)
    if env is None:
        # a backend's own error that says where it failed (``s3://…: reading ref 'x'
        # failed: …``), raised from one of the environment: its message, which says more
        cause = e.__cause__
        for _ in range(4):
            if cause is None:
                break
            inner = _environment(cause)
            if inner is not None:
                lead = inner.what.split(": ", 1)[0] + ": " if inner.what.startswith("the ") else ""
                env = EnvironmentFailure(lead + " ".join(str(e).split()))
                break
            cause = cause.__cause__
    if env is not None and store and _full_disk_behind_eio(e, store):
        env = EnvironmentFailure(
            f"{env.what} ({os.strerror(errno.ENOSPC)}: the disk holding the store is full)"
        )
    if env is None or not store or "://" in env.what:  # a message naming a store
        return env
    return EnvironmentFailure(f"store {store}: {env.what}")


def _full_disk_behind_eio(e: BaseException, store: str) -> bool:
    """Whether ``e`` is an I/O error of a local store whose disk has no space left: a write
    that failed for want of space can come back from the kernel's write-back as EIO (LMDB's
    commit on a full tmpfs does), which alone would not tell the user what to fix."""
    errno_ = getattr(e, "errno", None) or _errno_in(" ".join(str(e).split()))
    scheme, sep, rest = store.partition("://")
    if errno_ != errno.EIO or not sep or scheme not in ("lmdb", "file"):
        return False
    path = rest.split("?", 1)[0]
    try:
        st = os.statvfs(path if os.path.exists(path) else os.path.dirname(path) or ".")
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _environment(e: BaseException) -> EnvironmentFailure | None:
    import lmdb  # a core dependency, and imported by every local store already

    detail = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, lmdb.MapFullError):
        return EnvironmentFailure(f"the store's LMDB map is full: {detail}")
    if isinstance(e, lmdb.Error):
        errno_ = getattr(e, "errno", None) or _errno_in(detail)
        if errno_ in _ENV_ERRNOS:
            return EnvironmentFailure(f"the store's LMDB database could not be used: {detail}")
        return EnvironmentFailure(
            f"the store's LMDB database failed ({type(e).__name__}: {detail}); if it "
            "persists, the database file is damaged: copy the store folder before repairing"
        )
    root = type(e).__module__.split(".")[0]
    if root in ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "s3fs"):
        return EnvironmentFailure(f"the remote store could not be reached: {detail}")
    if isinstance(e, OSError) and e.errno in _ENV_ERRNOS:
        where = f"{e.filename}" if e.filename is not None else "writing the store"
        return EnvironmentFailure(f"{where}: {e.strerror or detail}")
    if isinstance(e, (ConnectionError, TimeoutError)):
        return EnvironmentFailure(f"the remote store could not be reached: {detail}")
    return None


def _errno_in(text: str) -> int | None:
    """The errno an LMDB message names by its text (py-lmdb keeps only the text)."""
    for code in _ENV_ERRNOS:
        if os.strerror(code) in text:
            return code
    return None


def run(handler: Handler, args: argparse.Namespace) -> int:
    """Run a verb, turning user errors into a message and an exit code (no traceback)."""
    try:
        return handler(args)
    except IntegrityError as e:
        # the input was fine; the store is damaged, which is what exit 1 reports
        return _fail(args, e, EXIT_PROBLEM)
    except Exception as e:
        if isinstance(e, BrokenPipeError):
            return _broken_pipe()
        env = environment_failure(e, getattr(args, "store", None))
        if env is not None:
            return _fail(args, env, EXIT_BAD_INPUT)
        # MedomniError covers NotFound / AmbiguousId (KeyErrors) and InvalidId / InvalidName;
        # ValueError covers bad URLs; ModuleNotFoundError a backend whose extra is absent.
        if isinstance(e, (MedomniError, OSError, ValueError, ModuleNotFoundError)):
            return _fail(args, e, EXIT_BAD_INPUT)
        raise
    except KeyboardInterrupt:
        sys.stderr.write("medomni: interrupted\n")
        return 130


def _broken_pipe() -> int:
    # the reader went away (`| head`): stop quietly, and keep Python's exit-time flush of
    # stdout from raising again
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (tests): nothing will be flushed to a pipe
    return EXIT_BROKEN_PIPE
