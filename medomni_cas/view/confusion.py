"""Per-class confusion of a result's class targets on the viewer's pages, as SVG.

A panel is one (agent, pair, class target) of a `Result`'s score rows, with a matrix per
arm: counts of (true class, class answered) pooled over the result's jobs, read from the
stored objects (`medomni_cas.bench.confusion`: the jobs' prediction columns against the
result's own answer columns, nothing derived or written). Only counts are shown, never a
patient or an answer. The result page lists the panels from its rows alone (no predictions
read); each panel is an image, computed when first asked for (reading the result's
predictions: seconds for millions of rows, in a worker thread), kept per result, and
drawn here as plain SVG (no script, no plotting library).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from medomni_cas.bench.confusion import ConfusionTable, confusion_tables
from medomni_cas.bench.metrics import METRICS
from medomni_cas.bench.records import Result
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.view.html import Html, esc, link

__all__ = ["ConfusionCache", "confusion_html", "panels", "svg"]

Panel = tuple[str, str, str]  # agent, pair, target


def panels(result: Result) -> list[Panel]:
    """The (agent, pair, target) of every class target the result scores, in order."""
    out = {
        (r.agent, r.pair, r.target)
        for r in result.rows
        if r.metric in METRICS and METRICS[r.metric].kind != "numeric"
    }
    return sorted(out)


def confusion_html(oid: ObjectId, result: Result) -> Html:
    """The result page's confusion section: an image a panel (empty: no class target)."""
    out = []
    for i, (agent, pair, target) in enumerate(panels(result)):
        src = f"/confusion/{oid.hex()}/{i}.svg"
        alt = f"confusion of {agent} on {pair} {target}"
        out.append(
            f'<p><img class="plot confusion" src="{src}" alt="{esc(alt)}"><br>'
            + link(src, f"{agent} {pair} {target}")
            + "</p>"
        )
    return "".join(out)


class ConfusionCache:
    """A few results' confusion tables, computed once each (a result never changes)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: OrderedDict[bytes, list[ConfusionTable]] = OrderedDict()
        self._lock = threading.Lock()

    def tables(self, store: Store, oid: ObjectId, result: Result) -> list[ConfusionTable]:
        with self._lock:
            got = self._items.get(bytes(oid))
            if got is not None:
                self._items.move_to_end(bytes(oid))
                return got
        got = confusion_tables(store, result.jobs, result.answer_columns)
        with self._lock:
            self._items[bytes(oid)] = got
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return got

    def panel_svg(self, store: Store, oid: ObjectId, result: Result, n: int) -> bytes | None:
        """Panel ``n`` of the result's `panels` as SVG; None when it has no such panel."""
        shown = panels(result)
        if not 0 <= n < len(shown):
            return None
        agent, pair, target = shown[n]
        tables = [
            t
            for t in self.tables(store, oid, result)
            if (t.agent, t.pair, t.target) == (agent, pair, target)
        ]
        return svg(f"{agent}: {pair} {target}", tables).encode()


# -- drawing -------------------------------------------------------------------------------
_CELL = 30
_LABEL = 44
_GAP = 28


def _shade(count: int, most: int) -> str:
    """White to a dark blue by the share of the table's largest count."""
    f = count / most if most else 0.0
    r, g, b = (int(255 - f * (255 - c)) for c in (8, 81, 156))
    return f"#{r:02x}{g:02x}{b:02x}"


def svg(title: str, tables: Sequence[ConfusionTable]) -> str:
    """The tables side by side (an arm each): rows the true class, columns the class
    answered and "none"; each cell its count. Every text is escaped."""
    parts: list[str] = []
    x = 8
    height = 0
    for t in tables:
        k = len(t.classes)
        cols = [*t.classes, "none"]
        most = max((v for row in t.matrix for v in row), default=0)
        top = 40
        parts.append(
            f'<text x="{x}" y="{top - 12}" font-size="11" font-weight="bold">{esc(t.arm)}</text>'
        )
        for j, c in enumerate(cols):
            cx = x + _LABEL + j * _CELL + _CELL // 2
            parts.append(
                f'<text x="{cx}" y="{top + k * _CELL + 14}" font-size="9" '
                f'text-anchor="middle">{esc(c)}</text>'
            )
        for i, c in enumerate(t.classes):
            cy = top + i * _CELL + _CELL // 2 + 4
            parts.append(
                f'<text x="{x + _LABEL - 4}" y="{cy}" font-size="9" '
                f'text-anchor="end">{esc(c)}</text>'
            )
            for j, v in enumerate(t.matrix[i]):
                cx = x + _LABEL + j * _CELL
                fill = _shade(v, most)
                ink = "#ffffff" if most and v / most > 0.6 else "#111111"
                parts.append(
                    f'<rect x="{cx}" y="{top + i * _CELL}" width="{_CELL}" height="{_CELL}" '
                    f'fill="{fill}" stroke="#cccccc"><title>truth {esc(c)}, answered '
                    f"{esc(cols[j])}: {v}</title></rect>"
                )
                if v:
                    parts.append(
                        f'<text class="count" x="{cx + _CELL // 2}" y="{cy}" font-size="10" '
                        f'text-anchor="middle" fill="{ink}">{v}</text>'
                    )
        parts.append(
            f'<text x="{x + _LABEL + (k + 1) * _CELL // 2}" y="{top + k * _CELL + 30}" '
            f'font-size="9" text-anchor="middle">answered (rows: truth)</text>'
        )
        x += _LABEL + (k + 1) * _CELL + _GAP
        height = max(height, top + k * _CELL + 40)
    width = max(x, 200)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 8}" '
        f'viewBox="0 0 {width} {height + 8}" font-family="sans-serif">'
        f'<text x="8" y="14" font-size="12">{esc(title)}</text>'
    )
    return head + "".join(parts) + "</svg>"
