"""HTML for notebooks: a record's fields as a small table (``Record._repr_html_``), and the
pieces the notebook's views are made of.

What is shown
    Every text is escaped. Ids (links, and 64-hex strings such as a config hash written as
    text) show their first 12 hex characters, with the full id in the ``title``; so do
    numbers, rounded to 4 significant digits. Nested structs are nested tables, a sequence
    of structs of one type is one table with a row each, and sequences, maps and strings
    that are long show their start and say how much more there is.

What is not
    Nothing here touches an object's bytes: it only reads the fields.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from medomni_cas.store.ids import ObjectId

__all__ = [
    "MAX_ITEMS",
    "esc",
    "fields_table",
    "grid",
    "id_html",
    "kv_table",
    "number_html",
    "record_html",
    "value_html",
]

MAX_ITEMS = 10
MAX_TEXT = 300
MAX_DEPTH = 4
_HEX_ID = re.compile(r"([0-9a-f]{64})(-\d+)?\Z")
_TABLE = '<table class="medomni">'
_CELL = ' style="text-align:left;vertical-align:top"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def id_html(oid: ObjectId | str) -> str:
    """An id shortened to 12 hex characters, the full id in its title."""
    full = oid.hex() if isinstance(oid, bytes) else oid
    return f'<code title="{esc(full)}">{esc(full[:12])}</code>'


def number_html(value: float) -> str:
    """A float rounded to 4 significant digits, its exact value in the title when they differ."""
    text = f"{value:.4g}"
    exact = repr(value)
    return esc(exact) if text == exact else f'<span title="{esc(exact)}">{esc(text)}</span>'


def _more(n: int, what: str = "more") -> str:
    return f'<span style="color:#888">… ({n} {what})</span>'


def _text(value: str) -> str:
    m = _HEX_ID.match(value)
    if m is not None:  # an id written as text, or a run id "<slot>-<attempt>"
        return id_html(m.group(1)) + esc(m.group(2) or "")
    if len(value) > MAX_TEXT:
        return esc(value[:MAX_TEXT]) + _more(len(value) - MAX_TEXT, "more characters")
    return esc(value)


def _row(cells: Sequence[str], tag: str = "td", *, head: bool = False) -> str:
    """A table row of HTML cells; ``head``: the first cell is a header (a field's name)."""
    out = [f"<th{_CELL}>{cells[0]}</th>"] if head and cells else []
    out += [f"<{tag}{_CELL}>{c}</{tag}>" for c in cells[len(out) :]]
    return "<tr>" + "".join(out) + "</tr>"


def _caption(text: str) -> str:
    return f'<caption style="text-align:left">{text}</caption>' if text else ""


def kv_table(items: Sequence[tuple[str, str]], caption: str = "") -> str:
    """A table of (name, HTML value) rows; names are escaped here, values are not."""
    return (
        _TABLE
        + _caption(caption)
        + "".join(_row([esc(k), v], head=True) for k, v in items)
        + "</table>"
    )


def grid(columns: Sequence[str], rows: Sequence[Sequence[str]], *, total: int | None = None) -> str:
    """A table with a header row; cells are HTML already. ``total``: rows there are in all."""
    body = _row([esc(c) for c in columns], "th") + "".join(_row(r) for r in rows)
    if total is not None and total > len(rows):
        body += f'<tr><td colspan="{len(columns)}"{_CELL}>{_more(total - len(rows))}</td></tr>'
    return _TABLE + body + "</table>"


def fields_table(struct: msgspec.Struct, depth: int = 0, caption: str = "") -> str:
    """One row per field: its name and its value."""
    items = [
        (name, value_html(getattr(struct, name), depth + 1)) for name in struct.__struct_fields__
    ]
    return kv_table(items, caption)


def _structs_grid(items: Sequence[msgspec.Struct], depth: int) -> str:
    fields = type(items[0]).__struct_fields__
    rows = [[value_html(getattr(s, f), depth + 1) for f in fields] for s in items[:MAX_ITEMS]]
    return grid(fields, rows, total=len(items))


def value_html(value: Any, depth: int = 0) -> str:
    """One value as HTML: ids short, structs as tables, long things truncated."""
    if isinstance(value, ObjectId):
        return id_html(value)
    if value is None:
        return '<span style="color:#888">None</span>'
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float):
        return number_html(value)
    if isinstance(value, bool | int):
        return esc(repr(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return esc(f"<{len(value)} bytes>")
    if depth > MAX_DEPTH:
        return _text(repr(value))
    if isinstance(value, msgspec.Struct):
        return fields_table(value, depth)
    if isinstance(value, Mapping):
        items = list(value.items())
        rows = [[_text(str(k)), value_html(v, depth + 1)] for k, v in items[:MAX_ITEMS]]
        if not rows:
            return "{}"
        body = "".join(_row(r, head=True) for r in rows)
        if len(items) > MAX_ITEMS:
            body += f'<tr><td colspan="2"{_CELL}>{_more(len(items) - MAX_ITEMS)}</td></tr>'
        return _TABLE + body + "</table>"
    if isinstance(value, tuple | list):
        if not value:
            return "()"
        first = value[0]
        if isinstance(first, msgspec.Struct) and all(type(v) is type(first) for v in value):
            return _structs_grid(value, depth)
        shown = [value_html(v, depth + 1) for v in value[:MAX_ITEMS]]
        nested = any(isinstance(v, msgspec.Struct | Mapping) for v in value[:MAX_ITEMS])
        out = "<br>".join(shown) if nested else ", ".join(shown)
        if len(value) > MAX_ITEMS:
            out += " " + _more(len(value) - MAX_ITEMS)
        return out
    return esc(repr(value))


def record_html(record: msgspec.Struct) -> str:
    """A stored record as a table captioned with its class, kind and version."""
    cls = type(record)
    kind = getattr(cls, "__kind__", "")
    version = getattr(cls, "__version__", 1)
    caption = f"<b>{esc(cls.__name__)}</b> <code>{esc(kind)}</code> v{esc(version)}"
    return fields_table(record, 0, caption)
