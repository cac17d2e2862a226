"""The errors of a build: a pair that cannot be built, and a config that changed without
the version rise it needs (raised by Build and by the sign-off check alike)."""

from __future__ import annotations

from medomni_cas.errors import MedomniError

__all__ = ["BuildError", "VersionError"]


class BuildError(MedomniError, ValueError):
    """A pair cannot be built from these files and data."""


class VersionError(BuildError):
    """A pair's config changed without the version rise it needs."""

    def __init__(self, pair: str, field: str, old: str, new: str, needed: str) -> None:
        self.pair, self.field, self.old, self.new, self.needed = pair, field, old, new, needed
        what = "results stop being comparable" if needed.endswith(".0") else "the task changed"
        super().__init__(
            f"{pair}: {field} changed since the build at version {old} ({what}); "
            f'set version: "{needed}" (or higher) in its cohort file, not {new!r}'
        )
