"""A workspace: a folder whose ``workspace.yaml`` names its store, folders and remotes.

This module is the one reader and writer of that file; nothing else parses it.

The file
--------
::

    store: lmdb://.medomni/store     # any store URL
    studio: studio                   # studio/datasets/<dataset>/...
    bench: bench                     # bench/benchmarks/<benchmark>/..., bench/agents/...
    runs: runs                       # run folders (views of run records)
    remotes:                         # for `medomni cas push/pull`
      origin: s3://bucket/prefix?endpoint_url=http://127.0.0.1:9000

Every key is optional; a folder without the file is a workspace with the defaults. An
unknown key, a value of the wrong type or a broken YAML file is a `SpecError` naming the
file, the line and the field, whichever command reads it.

Paths
-----
Folders, and the local paths of ``lmdb://`` and ``file://`` URLs (the store and remotes),
are relative to the workspace folder, not to the current directory.

The default store
-----------------
With no URL given, `open_store` (``mc.open()``) and the views open `default_store_url`:
the store of ``./workspace.yaml``, else ``lmdb://./.medomni/store``. `Workspace` holds no
open store (it is a value, not a context manager): the store it opens is the caller's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from medomni_cas.store.url import LOCAL_SCHEMES, local_path_problem
from medomni_cas.store.url import open_store as open_url

if TYPE_CHECKING:
    from medomni_cas.store.store import Store
    from medomni_cas.studio.specfile import Doc

__all__ = [
    "DEFAULT_REMOTE",
    "DEFAULT_STORE_URL",
    "WORKSPACE_FILE",
    "Workspace",
    "WorkspaceFile",
    "default_store_url",
    "load_workspace",
    "open_store",
]

WORKSPACE_FILE = "workspace.yaml"
DEFAULT_STORE_URL = "lmdb://./.medomni/store"
DEFAULT_REMOTE = "origin"


class WorkspaceFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``workspace.yaml``: the store and the folders of a workspace; every key is optional.

    A folder without the file is a workspace with the defaults. Folders and local
    (``lmdb://``, ``file://``) paths are relative to the workspace folder.

    A misspelt key is an error naming it, not an ignored line (forbid_unknown_fields).

    Fields:
        store: The store's URL (default ``lmdb://./.medomni/store``, in the workspace
            folder); relative ``lmdb://`` and ``file://`` paths are relative to the
            workspace folder.
        studio: The Studio folder, holding ``datasets/<dataset>/``.
        bench: The Bench folder, holding ``benchmarks/<benchmark>/`` and ``agents/``.
        runs: Where run folders are written (views of the run records in the store).
        remotes: Name to store URL, for ``medomni cas push`` and ``pull``; ``origin`` (or the
            only remote) is the default.
    """

    store: str | None = None
    studio: str = "studio"
    bench: str = "bench"
    runs: str = "runs"
    remotes: dict[str, str] = {}

    def problems(self) -> list[tuple[str, str]]:
        """Values the types cannot refuse: URLs without a scheme, local URLs without a path."""
        urls = [("store", self.store)] if self.store is not None else []
        urls += [(f"remotes.{name}", url) for name, url in self.remotes.items()]
        out = []
        for field, url in urls:
            if "://" not in url:
                out.append((field, f"not a store URL (expected scheme://...): {url!r}"))
            elif (problem := local_path_problem(url)) is not None:
                out.append((field, problem))
        return out


def _resolve(folder: Path, url: str) -> str:
    """A local store URL with its path made absolute against ``folder``."""
    if local_path_problem(url) is not None:
        return url  # refused where it is opened; never the workspace folder itself
    for scheme in LOCAL_SCHEMES:
        if url.startswith(scheme) and not url.startswith(scheme + "/"):
            rel, sep, query = url.removeprefix(scheme).partition("?")
            path = Path(rel).expanduser()
            return scheme + str((folder / path).resolve()) + sep + query
    return url


class Workspace:
    """A workspace folder and its settings, as read from its ``workspace.yaml``.

    A value: it holds no open store (`open_store` opens one, the caller closes it). The
    writers (`set_store`, `add_remote`) edit the file and return the workspace read again.
    """

    def __init__(self, root: Path, settings: WorkspaceFile, doc: Doc | None = None) -> None:
        self.root = root
        self.settings = settings
        self._doc = doc  # where an error about the file points; None without a file

    @classmethod
    def load(cls, start: str | Path = ".") -> Workspace:
        """The workspace in the folder ``start`` (checked: a bad file is a `SpecError`)."""
        root = Path(start).expanduser().resolve()
        path = root / WORKSPACE_FILE
        if not path.is_file():
            return cls(root, WorkspaceFile())
        # imported here: the loader brings PyYAML and Studio's schema helpers, which opening
        # a store by URL (every helper process of a check) need not pay for
        from medomni_cas.studio.specfile import SpecError, load_with_doc

        try:
            # `| None`: an empty file (or only comments) is a workspace with the defaults
            settings, doc = load_with_doc(path, WorkspaceFile | None)  # type: ignore[arg-type]  # a union is no type[T] (TypeForm: PEP 747)
        except SpecError as e:
            problem = e.problem.replace("`object | null`", "a mapping")
            raise SpecError(e.file, e.line, e.field, problem) from None
        return cls(root, settings or WorkspaceFile(), doc)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    # -- reading ---------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The workspace file (it need not exist)."""
        return self.root / WORKSPACE_FILE

    @property
    def exists(self) -> bool:
        """Whether the folder has a workspace file."""
        return self._doc is not None

    @property
    def store_url(self) -> str:
        """The store's URL, local paths made absolute; without one, ``.medomni/store`` in
        the workspace folder."""
        return _resolve(self.root, self.settings.store or DEFAULT_STORE_URL)

    @property
    def studio(self) -> Path:
        return self._folder(self.settings.studio)

    @property
    def bench(self) -> Path:
        return self._folder(self.settings.bench)

    @property
    def runs(self) -> Path:
        return self._folder(self.settings.runs)

    def _folder(self, value: str) -> Path:
        return (self.root / Path(value).expanduser()).resolve()

    @property
    def remotes(self) -> dict[str, str]:
        """Remote name -> URL, local paths made absolute."""
        return {name: _resolve(self.root, url) for name, url in self.settings.remotes.items()}

    def remote_url(self, name: str | None = None) -> str:
        """The URL of a remote: ``name`` itself if it is a URL (has ``://``), else the remote
        of that name; with no name, ``origin`` or the only remote."""
        if name is not None and "://" in name:
            return name
        remotes = self.remotes
        known = ", ".join(sorted(remotes)) or "none"
        if name is None:
            if DEFAULT_REMOTE in remotes:
                return remotes[DEFAULT_REMOTE]
            if len(remotes) == 1:
                return next(iter(remotes.values()))
            raise self._error("remotes", f"name a remote (known: {known}) or give a URL")
        if name not in remotes:
            raise self._error("remotes", f"no remote named {name!r} (known: {known})")
        return remotes[name]

    def open_store(
        self,
        *,
        single_writer: bool = False,
        create: bool = True,
        cache: bool | str | None = None,
    ) -> Store:
        """Open the workspace's store; the caller closes it (`medomni_cas.store.url.open_store`
        for the options)."""
        return open_url(self.store_url, single_writer=single_writer, create=create, cache=cache)

    # -- writing ---------------------------------------------------------------------------
    def check_store(self, url: str) -> None:
        """Refuse ``url`` if the file already names another store (before any work)."""
        current = self.settings.store
        if current is not None and not self._same(current, url):
            raise self._error(
                "store", f"already names store {current!r}; edit the file to change stores"
            )

    def check_remote(self, name: str, url: str) -> None:
        """Refuse ``name: url`` if the file already names that remote as another URL."""
        current = self.settings.remotes.get(name)
        if current is not None and not self._same(current, url):
            raise self._error(f"remotes.{name}", f"already names remote {name!r} as {current!r}")

    def set_store(self, url: str) -> Workspace:
        """Record ``url`` as the store (creating the file if needed); the file read again.
        Refused if it names another store; a no-op if it names this one."""
        self.check_store(url)
        if self.settings.store is None:
            self._put("store", url)
        return Workspace.load(self.root)

    def add_remote(self, name: str, url: str) -> Workspace:
        """Record the remote ``name: url``; the file read again. Refused if ``name`` is
        another URL's; a no-op if it is this one."""
        self.check_remote(name, url)
        if name not in self.settings.remotes:
            self._put("remotes", {**self.settings.remotes, name: url})
        return Workspace.load(self.root)

    def _put(self, key: str, value: object) -> None:
        """Set a top-level key: a new one is appended, so the user's comments and layout
        survive; an existing one (``store: null``, ``remotes: {}``, a mapping to extend)
        means writing the file again, which loses its comments."""
        import yaml

        text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
        root = None if self._doc is None else self._doc.root
        if root is None or all(k.value != key for k, _ in root.value):
            sep = "" if not text or text.endswith("\n") else "\n"
            text += sep + yaml.safe_dump({key: value}, sort_keys=False)
        else:
            data = yaml.safe_load(text)  # a mapping: load checked it
            data[key] = value
            text = yaml.safe_dump(data, sort_keys=False)
        self.path.write_text(text, encoding="utf-8")

    def _same(self, a: str, b: str) -> bool:
        return a == b or _resolve(self.root, a) == _resolve(self.root, b)

    def _error(self, field: str, problem: str) -> ValueError:
        from medomni_cas.studio.specfile import SpecError

        if self._doc is None:
            return SpecError(self.path, None, field, problem)
        return self._doc.error(field, problem)


def load_workspace(start: str | Path = ".") -> Workspace:
    """The workspace in ``start`` (`Workspace.load`)."""
    return Workspace.load(start)


def default_store_url(start: str | Path = ".") -> str:
    """The store of the workspace in ``start`` (its file checked), else the default."""
    return Workspace.load(start).store_url


def open_store(
    url: str | None = None,
    *,
    single_writer: bool = False,
    create: bool = True,
    cache: bool | str | None = None,
) -> Store:
    """Open the store at ``url``; with none, the store of ``./workspace.yaml``, else
    ``lmdb://./.medomni/store`` (this is ``mc.open``). Options as in
    `medomni_cas.store.url.open_store`."""
    return open_url(
        url or default_store_url(), single_writer=single_writer, create=create, cache=cache
    )
