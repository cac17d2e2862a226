"""The viewer's HTML: one page layout, escaped text, links to objects, tables and pagers.

Escaping
    Everything an object holds is untrusted (a hostile agent writes its own answer and
    logs), so every text goes through `esc` and every attribute is quoted; no page carries a
    script, and the app's Content-Security-Policy forbids one, so an escape missed here would
    still not run. Links are built only from ids (hex) and from names quoted by `url_part`.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Iterable, Sequence

from medomni_cas.store.ids import ObjectId

__all__ = [
    "CSS",
    "Html",
    "esc",
    "kv_table",
    "layout",
    "link",
    "num",
    "obj_link",
    "pager",
    "table",
    "url_part",
]

#: Escaped markup, ready to join: what every helper returns.
Html = str

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24}
header{background:#1f3a5f;color:#fff;padding:.5em 1em}
header a{color:#fff;margin-right:1.2em;text-decoration:none}
main{padding:1em}
h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.3em 0}
td,th{border:1px solid #d0d7de;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}
pre{background:#f6f8fa;padding:.6em;overflow:auto;max-height:40em;white-space:pre-wrap}
.hidden{color:#9a6700}.warn{color:#cf222e}.muted{color:#57606a}
ul.tree{list-style:none;padding-left:1.2em}ul.tree li{margin:.15em 0}
nav.pager{margin:.5em 0}nav.pager a,nav.pager span{margin-right:1em}
img.plot{max-width:100%;border:1px solid #d0d7de;margin:.3em 0}
"""

_NAV = (
    ("/", "overview"),
    ("/tasksets", "task sets"),
    ("/results", "results"),
    ("/comparisons", "comparisons"),
    ("/jobs", "jobs"),
    ("/refs", "refs"),
)


def esc(text: object) -> Html:
    """``text`` as HTML text or a quoted attribute value."""
    return html.escape(str(text), quote=True)


def url_part(text: str) -> str:
    """A name (a ref, a path in a tree) quoted for a URL path; ``/`` kept."""
    return urllib.parse.quote(text, safe="/")


def link(href: str, text: object) -> Html:
    """An anchor; ``href`` is made by the pages from ids and `url_part` names."""
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def obj_link(oid: ObjectId | bytes | str, text: object | None = None) -> Html:
    """A link to an object's page, its first 12 hex characters shown, the full id in the
    title."""
    full = oid if isinstance(oid, str) else bytes(oid).hex()
    shown = full[:12] if text is None else text
    return f'<a href="/object/{esc(full)}" title="{esc(full)}"><code>{esc(shown)}</code></a>'


def num(value: float | int | None, digits: int = 4) -> Html:
    if value is None:
        return '<span class="muted">-</span>'
    if isinstance(value, int):
        return esc(f"{value:,}")
    return esc(f"{value:.{digits}g}")


def table(head: Sequence[str], rows: Iterable[Sequence[Html]], *, cls: str = "") -> Html:
    """A table whose cells are already HTML (escape text with `esc` first)."""
    attr = f' class="{esc(cls)}"' if cls else ""
    out = [f"<table{attr}><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</table>")
    return "".join(out)


def kv_table(items: Iterable[tuple[str, Html]]) -> Html:
    return (
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
        + ("</table>")
    )


def pager(path: str, offset: int, limit: int, total: int, **params: str) -> Html:
    """Previous / next links over ``total`` items shown ``limit`` at a time."""
    if total <= limit and offset == 0:
        return ""

    def href(at: int) -> str:
        query = urllib.parse.urlencode({**params, "offset": at, "limit": limit})
        return f"{path}?{query}"

    last = max(0, (total - 1) // limit * limit)
    parts = [f"<span>{num(offset + 1)} to {num(min(offset + limit, total))} of {num(total)}</span>"]
    if offset > 0:
        parts.append(link(href(0), "first"))
        parts.append(link(href(max(0, offset - limit)), "previous"))
    if offset + limit < total:
        parts.append(link(href(offset + limit), "next"))
        parts.append(link(href(last), "last"))
    return '<nav class="pager">' + "".join(parts) + "</nav>"


def layout(title: str, body: Html, *, store_url: str = "") -> Html:
    """A whole page: the navigation bar, the title, the body."""
    nav = "".join(link(href, text) for href, text in _NAV)
    where = (
        f'<span class="muted" style="color:#c9d1d9">{esc(store_url)}</span>' if store_url else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} · medomni view</title><style>{CSS}</style></head>"
        f"<body><header>{nav}{where}</header><main><h1>{esc(title)}</h1>{body}</main>"
        "</body></html>"
    )
