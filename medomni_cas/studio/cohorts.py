"""Which smaller cohorts a nested cohort starts with: "the patients of n20 are the first
ones of n50".

A cohort without ``per_class`` takes the first ``n`` eligible patients in its seeded order,
so a smaller one of the same recipe is its prefix already. A per-class cohort fills each
class's count while scanning that order; two such cohorts hold the same first patients of
each class, but interleaved differently. ``selection: nested`` fixes the order: the cohort
is filled in stages, one per smaller cohort of the template with the same recipe (smallest
first) and then its own counts, each stage scanning the seeded order for the patients the
stage's counts still need. The set of patients is the same as without it; only the order
moves, so that every smaller cohort's patients come first, in its own order.

The stages are recorded in the cohort's part of the build config (``prefix``: the smaller
cohorts' counts), so that a rebuild from the config alone, with no cohort files, selects
the same patients in the same order.
"""

from __future__ import annotations

from typing import Any

import msgspec

from medomni_cas.studio.schema import NESTED, Cohort

__all__ = ["PREFIX_KEY", "NestingError", "nested_prefix", "not_first", "same_recipe"]

#: The key of a nested cohort's stages in `BuildConfig.cohort`.
PREFIX_KEY = "prefix"

# Fields of a cohort that make one cohort larger than another of the same recipe.
_SIZE = ("version", "description", "n", "per_class", "selection")


class NestingError(ValueError):
    """A nested cohort whose smaller cohorts cannot all be its first patients."""


def _recipe(c: Cohort) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(c, enc_hook=str)
    out = {k: v for k, v in d.items() if k not in _SIZE}
    out["per_class.label"] = c.per_class.label if c.per_class is not None else None
    return out


def same_recipe(a: Cohort, b: Cohort) -> bool:
    """Whether ``a`` and ``b`` select from the same patients in the same order."""
    return _recipe(a) == _recipe(b)


def _within(small: dict[str, int], big: dict[str, int]) -> str | None:
    """The first class of which ``small`` asks more than ``big``, or None."""
    return next((k for k, v in small.items() if v > big.get(k, 0)), None)


def nested_prefix(cohorts: dict[str, Cohort], name: str) -> list[dict[str, int]]:
    """The counts of each stage before cohort ``name``'s own, smallest first; empty unless
    it is a nested per-class cohort with smaller cohorts of the same recipe.

    A `NestingError` when a smaller cohort cannot be its prefix: it asks more of some class,
    two smaller ones do not nest in each other, or a smaller one that has smaller ones of
    its own is not nested itself (its order would not be the one this cohort starts with).
    """
    c = cohorts[name]
    if c.selection != NESTED or c.per_class is None:
        return []
    own = dict(c.per_class.counts)
    smaller = sorted(
        (
            (other.n, k)
            for k, other in cohorts.items()
            if k != name and other.per_class is not None and other.n < c.n and same_recipe(other, c)
        ),
    )
    stages: list[tuple[str, dict[str, int]]] = []
    for _n, k in smaller:
        other = cohorts[k]
        assert other.per_class is not None
        counts = dict(other.per_class.counts)
        cls = _within(counts, own)
        if cls is not None:
            raise NestingError(
                f"cohort {k} (the same recipe, n={other.n}) has {counts[cls]} of {cls}, more "
                f"than this cohort's {own.get(cls, 0)}: a nested cohort starts with every "
                "smaller cohort of its template"
            )
        if stages:
            prev, before = stages[-1]
            if before == counts:
                continue  # the same selection twice: one stage
            if _within(before, counts) is not None:
                raise NestingError(
                    f"cohorts {prev} and {k} (the same recipe) do not nest in each other, so "
                    "both cannot be this cohort's first patients"
                )
            if other.selection != NESTED:
                raise NestingError(
                    f"cohort {k} does not start with {prev}'s patients, so this cohort cannot "
                    f"start with both: write `selection: {NESTED}` in {k}'s file too (a new N)"
                )
        stages.append((k, counts))
    return [counts for _k, counts in stages]


def not_first(cohorts: dict[str, Cohort], name: str) -> list[str]:
    """The smaller per-class cohorts of the same recipe that are within cohort ``name`` but
    not its first patients, because it keeps the first rule (no ``selection``)."""
    c = cohorts[name]
    if c.selection == NESTED or c.per_class is None:
        return []
    own = dict(c.per_class.counts)
    return sorted(
        k
        for k, other in cohorts.items()
        if k != name
        and other.per_class is not None
        and other.n < c.n
        and same_recipe(other, c)
        and _within(dict(other.per_class.counts), own) is None
    )
