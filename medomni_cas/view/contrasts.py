"""Paired contrasts between arms on the viewer's pages: a `Comparison`'s rows and its plots.

A comparison (kind ``medomni.comparison``, kept under ``comparisons/<set>``) is read as
plain values (`fields.plain`), so these pages need nothing of the code that made it; its
plots are drawn from its rows by `medomni_cas.bench.plots` (the ``compare`` extra) when
that is installed, as SVG, and kept per comparison and plot: a comparison never changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from medomni_cas.errors import InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.view.fields import plain
from medomni_cas.view.html import Html, esc, link, num, table

__all__ = [
    "COMPARISON_KIND",
    "COMPARISON_REFS",
    "PLOTS",
    "PlotCache",
    "Warming",
    "comparison_of_set",
    "contrast_table",
    "plot_names",
    "plots_html",
    "read_comparison",
    "rows_of",
]

COMPARISON_KIND = "medomni.comparison"
COMPARISON_REFS = "comparisons/"
#: The plots a comparison may have: name -> the function of `medomni_cas.bench.plots`.
PLOTS = {"forest": "forest_figure", "ladder": "ladder_figure"}


def read_comparison(store: Store, oid: ObjectId) -> dict[str, Any] | None:
    """A comparison's fields as plain values, or None when ``oid`` is something else."""
    try:
        kind, _, body = encoding.decode(store.get_raw(oid))
    except (InvalidObject, NotFound):
        return None
    if kind != COMPARISON_KIND:
        return None
    values = plain(body)
    return values if isinstance(values, dict) else None


def comparison_of_set(
    store: Store, set_name: str, task_set: ObjectId
) -> tuple[ObjectId, dict[str, Any]] | None:
    """The latest comparison of ``set_name`` when it compares arms of ``task_set``."""
    try:
        oid = store.refs.get(COMPARISON_REFS + set_name)
    except ValueError:  # not a ref name
        return None
    if oid is None:
        return None
    values = read_comparison(store, oid)
    if values is None or values.get("task_set") != task_set:
        return None
    return oid, values


def _ci(row: dict[str, Any], low: str, high: str) -> Html:
    lo, hi = row.get(low), row.get(high)
    return "" if lo is None or hi is None else f"[{num(lo)}, {num(hi)}]"


def contrast_table(rows: list[dict[str, Any]]) -> Html:
    """One row a contrast: a - b on the same patients, its interval and test."""
    out = []
    for r in rows:
        why = r.get("excluded_why") or {}
        excluded = f"{r.get('excluded', 0):,}"
        if why:
            excluded += " (" + ", ".join(f"{k} {v}" for k, v in why.items()) + ")"
        test = str(r.get("test") or "")
        flag = str(r.get("config_flag") or "")
        out.append(
            [
                esc(r.get("agent", "")),
                esc(r.get("kind", "")),
                esc(f"{r.get('a', '')} - {r.get('b', '')}"),
                esc(r.get("pair", "")),
                esc(r.get("target", "")),
                esc(r.get("metric", "")),
                num(r.get("value_a")),
                num(r.get("value_b")),
                num(r.get("difference")),
                _ci(r, "ci_low", "ci_high"),
                num(r.get("patients")),
                esc(excluded),
                esc(test),
                num(r.get("p_value"), 3),
                num(r.get("p_holm"), 3),
                esc(f"{r.get('discordant', 0)} ({r.get('a_better', 0)} / {r.get('b_better', 0)})"),
                f'<span class="warn">{esc(flag)}</span>' if flag else "",
            ]
        )
    head = ["agent", "kind", "contrast", "pair", "target", "metric", "a", "b", "a - b"]
    head += ["95% CI", "patients", "excluded", "test", "p", "p (Holm)", "discordant (a/b)"]
    return table([*head, "flags"], out)


def plots_html(oid: ObjectId, rows: list[dict[str, Any]]) -> Html:
    """The comparison's plots as images (drawn when first asked for)."""
    shown = plot_names(rows)
    return "".join(
        f'<p><img class="plot" src="/plot/{oid.hex()}/{name}.svg" alt="{esc(name)} plot"><br>'
        + link(f"/plot/{oid.hex()}/{name}.svg", f"{name}.svg")
        + "</p>"
        for name in shown
    )


class PlotCache:
    """SVG bytes of (comparison, plot), drawn once; a few dozen kept.

    Reading a comparison's rows (`rows`) is the store's part, done where the store is read;
    drawing (`draw`) touches no store and takes seconds the first time (matplotlib's
    import), so the app runs it in a worker thread, not in its event loop.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._items: OrderedDict[tuple[bytes, str], bytes | None] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, oid: ObjectId, name: str) -> tuple[bool, bytes | None]:
        """(whether the plot was drawn already, its SVG or None)."""
        with self._lock:
            key = (bytes(oid), name)
            if key in self._items:
                self._items.move_to_end(key)
                return True, self._items[key]
        return False, None

    def draw(self, oid: ObjectId, name: str, rows: list[dict[str, Any]]) -> bytes | None:
        """Draw the plot ``name`` from the comparison's rows and keep it (None: it has none)."""
        data = _draw(name, rows)
        with self._lock:
            self._items[(bytes(oid), name)] = data
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return data


def plot_names(rows: list[dict[str, Any]]) -> list[str]:
    """The plots a comparison's rows make: forest for arm contrasts, ladder for rungs."""
    kinds = {r.get("kind") for r in rows}
    return [name for name, kind in (("forest", "arms"), ("ladder", "ladder")) if kind in kinds]


class Warming:
    """Drawing the plots of the latest comparisons (``comparisons/`` refs) in a background
    thread, so that the first page showing them need not wait for matplotlib; `stop` ends
    it after the plot it is drawing.

    Whoever serves the viewer stops it before leaving: a thread left running at exit is
    either waited for without end (an interrupt in the main thread's import can leave the
    import lock held, and the thread's own import then waits on it), or, as a daemon,
    stopped inside matplotlib's C++, which aborts the process ("terminate called without
    an active exception"). Hence a daemon, told to stop and waited for with a bound.
    """

    def __init__(self, store: Store, cache: PlotCache) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(store, cache), name="medomni-view-plots", daemon=True
        )
        self._thread.start()

    def _run(self, store: Store, cache: PlotCache) -> None:
        try:
            for _, oid in list(store.refs.items(COMPARISON_REFS))[: cache.size // 2]:
                rows = rows_of(store, oid) or []
                for name in plot_names(rows):
                    if self._stop.is_set():
                        return
                    if not cache.cached(oid, name)[0]:
                        cache.draw(oid, name, rows)
        except Exception:  # a warm-up only: the page draws it, or says why
            return

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up to end (at most ``timeout`` s); whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the current plot, waiting at most ``timeout`` s; whether it stopped."""
        self._stop.set()
        return self.join(timeout)


def rows_of(store: Store, oid: ObjectId) -> list[dict[str, Any]] | None:
    """A comparison's contrast rows, or None when ``oid`` is no comparison."""
    values = read_comparison(store, oid)
    return None if values is None else list(values.get("rows") or [])


def _draw(name: str, rows: list[dict[str, Any]]) -> bytes | None:
    import importlib
    import io

    if name not in PLOTS:
        return None
    # the compare extra draws plots (matplotlib, imported when one is drawn)
    plots = importlib.import_module("medomni_cas.bench.plots")
    fig = getattr(plots, PLOTS[name])(rows)
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()
