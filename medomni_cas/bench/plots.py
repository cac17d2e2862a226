"""Plots of comparisons and scores: the ladder as a curve, the arm contrasts as a forest plot,
per-class confusion; PNG and SVG files, or figures for a notebook.

Every function takes plain data, never the store: contrast rows (`ContrastRow`\\ s or their
dicts, as in comparisons.json) and confusion tables (`medomni_cas.bench.confusion`), so the
viewer and the notebook draw the same plots from what they already hold. matplotlib (the
``compare`` extra) is imported when a plot is made, with the Agg backend: no display needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medomni_cas._extras import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "comparison_plots",
    "confusion_figure",
    "forest_figure",
    "ladder_figure",
    "ladder_points",
    "save",
]

Row = Mapping[str, Any] | Any  # a ContrastRow, or its dict


def _get(row: Row, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def _pyplot() -> Any:
    mpl = require("matplotlib", "compare", "plots")
    mpl.use("Agg", force=False)
    return require("matplotlib.pyplot", "compare", "plots")


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    _pyplot()
    return Figure(figsize=(width, height), layout="constrained")


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.png and ``stem``.svg; returns their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "svg"):
        path = stem.with_suffix(f".{ext}")
        # svg.hashsalt and no date: the same plot makes the same bytes
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(path, format=ext, dpi=110, metadata=meta)
        out.append(path)
    return out


def forest_figure(rows: Sequence[Row]) -> Figure | None:
    """The arm contrasts (rows of kind "arms") as a forest plot: each contrast's difference
    and its 95% interval, a row each, zero marked; None when there are none."""
    arms = [r for r in rows if _get(r, "kind") == "arms" and _get(r, "difference") is not None]
    if not arms:
        return None
    fig = _figure(8.0, 1.0 + 0.45 * len(arms))
    ax = fig.add_subplot()
    for i, r in enumerate(reversed(arms)):
        d, lo, hi = _get(r, "difference"), _get(r, "ci_low"), _get(r, "ci_high")
        better = (d > 0) == bool(_get(r, "higher_is_better"))
        color = "tab:green" if better and d != 0 else "tab:red" if d != 0 else "tab:gray"
        if lo is not None and hi is not None:
            ax.hlines(i, lo, hi, color=color, linewidth=2)
        ax.plot([d], [i], "o", color=color)
    ax.axvline(0.0, color="black", linewidth=0.8, linestyle="--")
    labels = [
        f"{_get(r, 'a')} - {_get(r, 'b')}\n{_get(r, 'pair')} {_get(r, 'metric')} "
        f"({_get(r, 'agent')}, n={_get(r, 'patients')}"
        + (f", p={_get(r, 'p_holm'):.2g} Holm" if _get(r, "p_holm") is not None else "")
        + ")"
        for r in reversed(arms)
    ]
    ax.set_yticks(range(len(arms)), labels, fontsize=7)
    ax.set_xlabel("difference a - b (95% paired bootstrap interval)")
    ax.set_title("Arm contrasts on the same patients")
    return fig


def ladder_points(rows: Sequence[Row]) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
    """The ladder's curves from the rows of each rung against the first ("rN - r1", and
    "r2 - r1"): per (agent, pair, target, metric), one point a rung in order, with its
    value, interval and the families it adds."""
    curves: dict[tuple[str, str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if _get(r, "kind") != "ladder":
            continue
        key = (_get(r, "agent"), _get(r, "pair"), _get(r, "target"), _get(r, "metric"))
        points = curves.setdefault(key, {})
        for side in ("a", "b"):
            label = _get(r, side)
            if label in points:
                continue
            points[label] = {
                "rung": label.rpartition(".")[2],
                "value": _get(r, f"value_{side}"),
                "ci_low": _get(r, f"{side}_ci_low"),
                "ci_high": _get(r, f"{side}_ci_high"),
                "families": list(_get(r, f"families_{side}")),
            }
    out = {}
    for key, points in curves.items():
        ordered = sorted(points.values(), key=lambda p: (len(p["families"]), p["rung"]))
        staged: list[str] = []
        for p in ordered:
            p["added"] = [f for f in p["families"] if f not in staged]
            staged = p["families"]
        out[key] = ordered
    return out


def ladder_figure(rows: Sequence[Row]) -> Figure | None:
    """The modality ladder as a curve per pair and target (a line per agent): the metric
    with its interval at r1…r6, the families each rung adds under its name; None when the
    rows hold no ladder."""
    curves = ladder_points(rows)
    if not curves:
        return None
    panels = sorted({(p, t, m) for _, p, t, m in curves})
    fig = _figure(6.5, 3.6 * len(panels))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (pair, target, metric) in zip(axes, panels, strict=True):
        ticks: list[str] = []
        for (agent, p, t, m), points in sorted(curves.items()):
            if (p, t, m) != (pair, target, metric):
                continue
            xs = list(range(len(points)))
            ys = [pt["value"] for pt in points]
            lo = [pt["value"] - pt["ci_low"] if pt["ci_low"] is not None else 0 for pt in points]
            hi = [pt["ci_high"] - pt["value"] if pt["ci_high"] is not None else 0 for pt in points]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=agent)
            if len(points) > len(ticks):
                ticks = [f"{pt['rung']}\n+" + "\n+".join(pt["added"]) for pt in points]
        ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
        ax.set_ylabel(metric)
        ax.set_title(f"{pair} {target}: modality ladder", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def confusion_figure(table: Mapping[str, Any]) -> Figure:
    """One confusion matrix: ``table`` has ``classes``, ``matrix`` (rows: truth, columns:
    prediction, a last column for no answer) and a ``title``."""
    classes = list(table["classes"])
    matrix = table["matrix"]
    fig = _figure(1.2 + 0.55 * (len(classes) + 1), 1.0 + 0.5 * len(classes))
    ax = fig.add_subplot()
    ax.imshow(matrix, cmap="Blues")
    columns = [*classes, "none"]
    ax.set_xticks(range(len(columns)), columns, fontsize=7)
    ax.set_yticks(range(len(classes)), classes, fontsize=7)
    for i, line in enumerate(matrix):
        for j, v in enumerate(line):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
    ax.set_xlabel("answered")
    ax.set_ylabel("truth")
    ax.set_title(str(table.get("title", "")), fontsize=8)
    return fig


def comparison_plots(rows: Sequence[Row], folder: Path) -> list[Path]:
    """``forest.png/.svg`` and ``ladder.png/.svg`` in ``folder`` (those the rows have)."""
    out: list[Path] = []
    for name, make in (("forest", forest_figure), ("ladder", ladder_figure)):
        fig = make(rows)
        if fig is not None:
            out += save(fig, folder / name)
    return out
