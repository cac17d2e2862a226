"""The process runner's launcher: runs an agent command so that nothing it starts outlives it.

::

    python -m medomni_cas.bench.sandbox [--isolation none|namespaces] [--hide PATH]...
        [--keep PATH]... [--status FILE] -- COMMAND [ARG]...

The command runs with the launcher's environment and working folder. When it exits, every
process it started is killed, even one that left its session (``setsid``) or was orphaned;
the launcher exits with the command's status (128 + N for a signal N). SIGTERM or SIGINT
to the launcher kills them all at once (the harness's timeout).

Isolation
---------
``none``
    The launcher makes itself a child subreaper, so orphaned descendants are reparented to
    it rather than to init, and kills them all once the command exits. The agent still runs
    as you, and sees what you see.
``namespaces``
    New mount and pid namespaces (and a user namespace when not run as root, so it works
    unprivileged where Linux allows user namespaces). Each ``--hide`` path is covered with
    an empty read-only tmpfs (a file with /dev/null), each ``--keep`` path beneath one is
    bound back in, and a fresh /proc shows only the agent's own processes (no
    ``/proc/<harness pid>/cwd``). The command runs without capabilities and with
    no_new_privs, so it cannot unmount what hides the paths. The network is shared (the
    perception gateway listens on loopback). The launcher's first child is the namespace's
    init: when the command exits, it exits, and the kernel kills everything left inside.

``--probe`` sets up the namespaces, runs nothing, and exits 0 when they work.

A setup failure (no namespaces here) is written to ``--status`` (and stderr), and the
launcher exits 125 without running the command. This module uses only the standard
library, so the harness runs it by path with ``python -I -S``: no package import per trial.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import sys

# Imports cost most of a launch, paid per trial: no `typing` (TYPE_CHECKING is spelt out),
# and `_signal` for `signal`, which imports enum (the same functions, plain int constants).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Sequence
else:
    import _signal as signal

__all__ = ["SETUP_FAILED", "main"]

SETUP_FAILED = 125

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The namespaces could not be set up: nothing ran."""


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype or source or ''} on {target}",
    )


def _prctl(option: int, arg: int = 0, arg3: int = 0) -> int:
    return int(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(arg3), 0, 0))


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


# -- none: a subreaper that kills what is left ----------------------------------------------------
def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # no CONFIG_PROC_CHILDREN: scan for our children
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat.rpartition(")")[2].split()[1]) == me:
                    out.append(int(entry))
        return out


def _kill(pid: int) -> None:
    try:  # noqa: SIM105 - contextlib is one more import per trial
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_descendants() -> None:
    """Kill every child until none is left; orphans of the killed come to us (subreaper)."""
    while True:
        for pid in _children():
            _kill(pid)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _run_plain(cmd: Sequence[str]) -> int:
    if _prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
        print("medomni-sandbox: no child subreaper: orphans may outlive the agent", file=sys.stderr)
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in _children():
            _kill(pid)

    signal.signal(signal.SIGTERM, stop)  # before the fork: no moment without it
    signal.signal(signal.SIGINT, stop)
    agent = os.fork()
    if agent == 0:
        _exec(cmd)
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == agent:
            code = _exit_code(status)
            break
    _kill_descendants()
    return 128 + signal.SIGTERM if stopping else code


# -- namespaces -------------------------------------------------------------------------------
def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _hide(hide: Sequence[str], keep: Sequence[str]) -> None:
    """Cover each hidden path; bind each kept path beneath one back in."""
    hide = sorted({os.path.realpath(p) for p in hide if os.path.lexists(p)})
    tops = [p for p in hide if not any(q != p and _under(p, q) for q in hide)]
    kept = [os.path.realpath(p) for p in keep if os.path.exists(p)]
    kept = [p for p in dict.fromkeys(kept) if any(_under(p, t) for t in tops)]
    fds = [os.open(p, os.O_PATH | os.O_CLOEXEC) for p in kept]  # reachable once covered
    covers = []
    for p in tops:
        if os.path.isdir(p) and not os.path.islink(p):
            _mount("tmpfs", p, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=64k")
            covers.append(p)
        else:
            _mount("/dev/null", p, None, _MS_BIND)
    for p, fd in zip(kept, fds, strict=True):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "ab"):
                pass
        _mount(f"/proc/self/fd/{fd}", p, None, _MS_BIND | _MS_REC)
        os.close(fd)
    for p in covers:
        flags = _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _mount(None, p, None, flags, "mode=0755,size=64k")


def _enter(hide: Sequence[str], keep: Sequence[str]) -> None:
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID
    if uid != 0:
        flags |= _CLONE_NEWUSER  # unprivileged: a user namespace gives the mount rights
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    if uid != 0:
        try:
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as e:
            raise SetupError(f"user namespace id maps: {e.strerror}") from None
    cwd = os.getcwd()
    # never let a mount made here reach the host's namespace
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _hide(hide, keep)
    # the old cwd is the covered directory itself, whose ``..`` leads to what is hidden:
    # enter it again by its path, through the new mounts
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")


def _drop_privileges() -> None:
    """No capabilities across exec (root included): the hiding mounts stay in place."""
    for cap in range(64):
        if _prctl(_PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
            break  # past the last capability this kernel knows
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    data = (Data * 2)()
    _check(_libc.capset(ctypes.byref(Header(_CAP_VERSION_3, 0)), data), "capset")
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")


def _run_isolated(cmd: Sequence[str], hide: Sequence[str], keep: Sequence[str], status: str) -> int:
    _enter(hide, keep)
    r, w = os.pipe()  # the child says whether its setup worked before the command runs
    alive, held = os.pipe()  # held open by the launcher: EOF in the child when it is gone
    init = 0

    def stop(_sig: int, _frame: object) -> None:
        if init:
            _kill(init)  # the namespace goes with its init

    signal.signal(signal.SIGTERM, stop)  # before the fork: no moment without it
    signal.signal(signal.SIGINT, stop)
    init = os.fork()
    if init == 0:
        os.close(r)
        os.close(held)
        try:
            code = _init(cmd, alive, w)
        except BaseException as e:  # never return into the launcher's code
            try:  # noqa: SIM105 - contextlib is one more import per trial
                os.write(w, f"namespace init: {type(e).__name__}: {e}".encode())
            except OSError:
                pass
            code = SETUP_FAILED
        os._exit(code)
    os.close(w)
    os.close(alive)
    problem = b""
    while chunk := os.read(r, 4096):
        problem += chunk
    os.close(r)
    _, st = os.waitpid(init, 0)
    if problem:
        _report(status, problem.decode(errors="replace"))
        return SETUP_FAILED
    return _exit_code(st)


def _init(cmd: Sequence[str], alive: int, w: int) -> int:
    """Pid 1 of the new namespace: a fresh /proc, the agent, and reaping until it exits."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive], [], [], 0)[0]:  # EOF: the launcher died before the line above
            return SETUP_FAILED
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except SetupError as e:
        os.write(w, str(e).encode())
        return SETUP_FAILED
    os.close(w)  # setup done: the launcher stops waiting for a problem
    agent = os.fork()
    if agent == 0:
        try:
            _drop_privileges()
        except SetupError as e:
            print(f"medomni-sandbox: {e}", file=sys.stderr)
            os._exit(SETUP_FAILED)
        _exec(cmd)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if pid == agent:
            return _exit_code(status)  # leaving kills whatever else is in the namespace


def _exec(cmd: Sequence[str]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        os.execvp(cmd[0], list(cmd))
    except OSError as e:
        print(f"medomni-sandbox: could not start {cmd[0]}: {e.strerror}", file=sys.stderr)
    os._exit(127)


def _report(status: str, problem: str) -> None:
    print(f"medomni-sandbox: {problem}", file=sys.stderr)
    if status:
        with open(status, "w") as f:
            f.write(problem)


_USAGE = (
    "usage: python -m medomni_cas.bench.sandbox [--isolation none|namespaces] [--hide PATH]... "
    "[--keep PATH]... [--status FILE] [--parent PID] [--probe] -- COMMAND [ARG]..."
)


def _args(argv: list[str]) -> dict[str, list[str]]:
    """The options, by hand: argparse costs more to import than the rest of a launch."""
    out: dict[str, list[str]] = {"cmd": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out["cmd"] = argv[i + 1 :]
            break
        if a == "--probe":
            out["probe"] = ["1"]
        elif a in ("--isolation", "--hide", "--keep", "--status", "--parent") and i + 1 < len(argv):
            out.setdefault(a[2:], []).append(argv[i + 1])
            i += 1
        else:
            raise SystemExit(f"{_USAGE}\nunknown or incomplete option {a!r}")
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(list(sys.argv[1:] if argv is None else argv))
    isolation = (args.get("isolation") or ["namespaces"])[-1]
    if isolation not in ("none", "namespaces"):
        raise SystemExit(f"{_USAGE}\n--isolation: want none or namespaces, got {isolation!r}")
    status = (args.get("status") or [""])[-1]
    cmd, probe = args["cmd"], "probe" in args
    if not cmd and not probe:
        raise SystemExit(f"{_USAGE}\nname a command after --")
    parent = args.get("parent")
    if parent:
        # the harness dying ends the agent too (SIGTERM: we kill what it started, then exit)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != int(parent[-1]):  # it died before the line above
            return SETUP_FAILED
    if isolation == "none":
        return _run_plain(cmd) if cmd else 0
    try:
        return _run_isolated(
            cmd or [sys.executable, "-I", "-S", "-c", ""],
            args.get("hide", []),
            args.get("keep", []),
            status,
        )
    except SetupError as e:
        _report(status, str(e))
        return SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main())
