"""What the notebook shows of a comparison: its contrasts as a table, its plots inline."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from medomni_cas.bench.comparisons import Comparison
from medomni_cas.bench.contrasts import comparison_lines, rows_table
from medomni_cas.bench.plots import forest_figure, ladder_figure
from medomni_cas.notebook.html import esc, grid, id_html, kv_table
from medomni_cas.notebook.tables import to_pandas
from medomni_cas.store.ids import ObjectId

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = ["ComparisonView"]


def _num(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _svg(fig: Figure | None) -> str:
    if fig is None:
        return ""
    sink = io.StringIO()
    fig.savefig(sink, format="svg", metadata={"Date": None})
    text = sink.getvalue()
    return text[text.index("<svg") :]  # the figure alone, without the XML prolog


@dataclass(frozen=True, eq=False)
class ComparisonView:
    """A stored comparison: one row per contrast (`table`, `to_pandas`), the forest plot
    of the arm contrasts and the ladder's curves (`forest`, `ladder`: matplotlib figures),
    all shown inline in a notebook."""

    id: ObjectId
    record: Comparison
    set_name: str

    @property
    def table(self) -> pa.Table:
        return rows_table(self.record.rows)

    def to_pandas(self) -> pd.DataFrame:
        return to_pandas(self.table)

    df = to_pandas

    def forest(self) -> Figure | None:
        """The arm contrasts (encoders - no-perception, ...) as a forest plot."""
        return forest_figure(self.record.rows)

    def ladder(self) -> Figure | None:
        """The modality ladder as a curve per pair and target."""
        return ladder_figure(self.record.rows)

    def __repr__(self) -> str:
        return f"ComparisonView ({self.set_name})\n" + "\n".join(
            comparison_lines(self.id, self.record)
        )

    def _repr_html_(self) -> str:
        r = self.record
        head = kv_table(
            [
                ("set", esc(self.set_name)),
                ("task set", id_html(r.task_set)),
                ("comparer", esc(f"{r.comparer} {r.comparer_version}")),
                ("bootstrap", esc(f"n_boot={r.n_boot} seed={r.seed} (patients resampled)")),
                ("jobs", esc(len(r.jobs))),
            ],
            caption=f"<b>ComparisonView</b> {id_html(self.id)}",
        )
        columns = ["agent", "a - b", "pair", "target", "metric", "a", "b", "a - b", "95% CI"]
        columns += ["test", "p", "p (Holm)", "patients", "excluded", "flag"]
        rows = [
            [
                esc(x.agent),
                esc(f"{x.a} - {x.b}"),
                esc(x.pair),
                esc(x.target),
                esc(x.metric),
                _num(x.value_a),
                _num(x.value_b),
                _num(x.difference),
                esc(f"[{_num(x.ci_low)}, {_num(x.ci_high)}]"),
                esc(x.test or "-"),
                _num(x.p_value, ".3g"),
                _num(x.p_holm, ".3g"),
                esc(f"{x.patients} ({x.discordant} discordant)"),
                esc(", ".join(f"{n} {w}" for w, n in x.excluded_why.items()) or "-"),
                esc(x.config_flag),
            ]
            for x in r.rows
        ]
        return head + grid(columns, rows) + _svg(self.forest()) + _svg(self.ladder())
