"""Optional dependencies: import one, or say which extra installs it.

The core install is the store, Studio, Bench's harness and the CLI. What only some uses need
is an extra of the distribution (pyproject.toml), imported where it is used, never at import
time of a core module::

    notebook    pandas, ipywidgets       tables such as ws.runs_df(); widget progress bars
    bench       starlette, uvicorn       the perception gateway of encoder arms
    view        starlette, uvicorn       the results viewer (``medomni view``)
    s3          s3fs                     s3:// stores (fsspec names it itself)
    compare     scipy, matplotlib        paired tests between arms; ladder and forest plots
    attest      cryptography             signed attestations of results (Ed25519, DSSE)

``require("pandas", "notebook")`` returns the module, or raises `MissingExtra` whose message
is the command that fixes it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from medomni_cas.errors import MedomniError

__all__ = ["DISTRIBUTION", "MissingExtra", "require"]

DISTRIBUTION = "medomni-cas"


class MissingExtra(MedomniError, ModuleNotFoundError):
    """``module`` is not installed; the ``extra`` of medomni-cas installs it.

    A `ModuleNotFoundError` too, so code that already handles a missing module still does.
    """

    def __init__(self, module: str, extra: str, purpose: str = "") -> None:
        self.module = module
        self.extra = extra
        self.purpose = purpose
        need = f" (needed for {purpose})" if purpose else ""
        super().__init__(
            f"{module} is not installed{need}: pip install '{DISTRIBUTION}[{extra}]'",
            name=module,
        )


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module``; if it (or its top-level package) is missing, raise `MissingExtra`.

    A module that is there but fails to import for another reason (one of *its* imports is
    missing, a syntax error) raises as it is: reinstalling the extra would not fix that.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        parts = module.split(".")
        if e.name not in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise
        raise MissingExtra(module, extra, purpose) from e
