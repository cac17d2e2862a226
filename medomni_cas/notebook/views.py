"""What the notebook shows: a task set and its build, a stored score (text and HTML reprs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from medomni_cas.bench.records import Result
from medomni_cas.notebook.html import esc, grid, id_html, kv_table
from medomni_cas.notebook.tables import atoms_table, to_pandas
from medomni_cas.porcelain import format_value
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import SetEntry, TaskSetRecord

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ResultView", "TaskSetView", "text_table"]


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Columns padded to their widest cell, for reprs."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = [columns, *rows]
    return "\n".join(
        indent + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


@dataclass(frozen=True, eq=False)
class TaskSetView:
    """A recorded task set and its latest build: what ``studio taskset show`` prints."""

    name: str
    task_set: ObjectId  # the task set content hash
    record: TaskSetRecord
    build: ObjectId | None  # the latest SetBuild of this very set, if any
    entries: tuple[SetEntry, ...]  # one per pair x arm (and rung) built
    store: Store = field(repr=False)

    @property
    def pairs(self) -> list[str]:
        return [f"{p.task} (N={p.n})" for p in self.record.pairs]

    def atoms(self) -> pa.Table:
        """One row per atom task: pair, version, arm, variant, patient, atom id, config
        hash, prediction time, families staged and the pair's build."""
        return atoms_table(self.store, self.entries)

    def atoms_df(self) -> pd.DataFrame:
        return to_pandas(self.atoms())

    def __repr__(self) -> str:
        r = self.record
        built = f"build {self.build.short}" if self.build is not None else "not built"
        head = [
            f"TaskSetView {self.name}",
            f"  task set {self.task_set.short}  builder {r.builder}  {built}",
            f"  arms     {', '.join(r.arms)}",
            f"  pairs    {', '.join(self.pairs)}",
        ]
        if not self.entries:
            return "\n".join(head)
        rows = [
            [e.pair, e.version, arm_label(e.arm, e.arm_variant), e.config.short]
            for e in self.entries
        ]
        return "\n".join(head) + "\n" + text_table(["pair", "version", "arm", "config"], rows)

    def _repr_html_(self) -> str:
        r = self.record
        head = kv_table(
            [
                ("task set", id_html(self.task_set)),
                ("builder", esc(r.builder)),
                ("arms", esc(", ".join(r.arms))),
                ("pairs", "<br>".join(esc(p) for p in self.pairs)),
                ("build", id_html(self.build) if self.build is not None else "not built"),
            ],
            caption=f"<b>TaskSetView</b> {esc(self.name)}",
        )
        rows = [
            [
                esc(e.pair),
                esc(e.version),
                esc(arm_label(e.arm, e.arm_variant)),
                id_html(e.config),
                id_html(e.result),
            ]
            for e in self.entries
        ]
        entries = grid(["pair", "version", "arm", "config hash", "build"], rows)
        return head + (entries if rows else "")


@dataclass(frozen=True, eq=False)
class ResultView:
    """A stored score: its rows as a table, and the record that links what it came from."""

    id: ObjectId
    record: Result
    set_name: str
    table: pa.Table  # the rows, read from the result's Parquet blob

    @property
    def task_set(self) -> ObjectId:
        return self.record.task_set

    @property
    def jobs(self) -> tuple[ObjectId, ...]:
        return self.record.jobs

    def df(self) -> pd.DataFrame:
        return to_pandas(self.table)

    def _header(self) -> list[tuple[str, str]]:
        r = self.record
        return [
            ("set", self.set_name),
            ("task set", r.task_set.hex()),
            ("scorer", f"{r.scorer} {r.scorer_version}"),
            ("bootstrap", f"n_boot={r.n_boot} seed={r.seed}"),
            ("jobs", str(len(r.jobs))),
            ("answer keys", str(len(r.answer_keys))),
        ]

    def _rows(self) -> list[list[str]]:
        return [
            [
                s.agent,
                arm_label(s.arm, s.arm_variant),
                s.pair,
                s.target,
                s.metric,
                format_value(s.value),
                f"[{format_value(s.ci_low)}, {format_value(s.ci_high)}]",
                str(s.n),
                str(s.n_missing),
                s.config_flag,
            ]
            for s in self.record.rows
        ]

    _COLUMNS = ("agent", "arm", "pair", "target", "metric", "value", "95% CI", "n", "missing")

    def __repr__(self) -> str:
        head = [f"ResultView {self.id.short} ({self.set_name})"]
        head += [f"  {k:<11} {v[:12] if k == 'task set' else v}" for k, v in self._header()[1:]]
        rows = self._rows()
        flagged = any(r[-1] for r in rows)
        cols = [*self._COLUMNS, "flag"] if flagged else list(self._COLUMNS)
        body = [r if flagged else r[:-1] for r in rows]
        return "\n".join(head) + "\n" + text_table(cols, body)

    def _repr_html_(self) -> str:
        items = [(k, id_html(v) if k == "task set" else esc(v)) for k, v in self._header()]
        head = kv_table(items, caption=f"<b>ResultView</b> {id_html(self.id)}")
        rows = [[esc(c) for c in r] for r in self._rows()]
        return head + grid([*self._COLUMNS, "flag"], rows)
