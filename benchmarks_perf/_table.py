"""One results table: our figure, the baseline from the same run, their ratio, the target."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One measurement. ``target`` is a minimum ratio (ours / baseline) unless ``max_value``
    is set, which makes the target an upper bound on our own figure (e.g. peak memory)."""

    name: str
    ours: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: float | None = None
    max_value: float | None = None
    max_ratio: float | None = None  # the target is an upper bound on ours / baseline
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if not self.baseline:
            return None
        return self.ours / self.baseline

    @property
    def verdict(self) -> str:
        if self.max_value is not None:
            return "PASS" if self.ours < self.max_value else "MISS"
        if self.max_ratio is not None and self.ratio is not None:
            return "PASS" if self.ratio <= self.max_ratio else "MISS"
        if self.target is None or self.ratio is None:
            return ""
        return "PASS" if self.ratio >= self.target else "MISS"

    @property
    def target_text(self) -> str:
        if self.max_value is not None:
            return f"< {_num(self.max_value)} {self.unit}"
        if self.max_ratio is not None:
            return f"<= {self.max_ratio:g}x"
        if self.target is not None:
            return f">= {self.target:g}x"
        return ""


def _num(x: float) -> str:
    """Three significant figures, with k/M suffixes for rates (easier to scan than 6 digits)."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= (div if div >= 1e6 else 10 * div):
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def render(rows: list[Row]) -> str:
    """A Markdown table, so the same text goes to the terminal and to RESULTS.md."""
    head = ["benchmark", "ours", "baseline (same run)", "ratio", "target", "result", "note"]
    body = [
        [
            r.name,
            f"{_num(r.ours)} {r.unit}",
            f"{_num(r.baseline)} {r.unit} ({r.baseline_name})" if r.baseline else "",
            f"{r.ratio:.2f}x" if r.ratio is not None else "",
            r.target_text,
            r.verdict,
            r.note,
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(b) for b in body)])
