"""The viewer's pages: each reads what it shows (`queries`) and returns escaped HTML.

A page function takes the `Context` and its parameters and returns a `Page`; what cannot
be shown raises `PageError` (404 for an id or name the store does not hold, naming it; 403
for an answer the viewer hides). Objects link to ``/object/<id>``, which shows any object by
its kind: a result, a job, a run, a task set, a tree or blob with their own pages, and any
other record (a plug-in's, or a later kind) as its fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from medomni_cas.bench.records import (
    AgentConfig,
    JobRecord,
    PredictionRecord,
    Result,
    RunRecord,
    ScoreRow,
)
from medomni_cas.bench.refnames import JOB_REFS, RESULT_REFS, result_ref
from medomni_cas.errors import AmbiguousId, InvalidId, InvalidName, InvalidObject, NotFound
from medomni_cas.store import encoding
from medomni_cas.store.encoding import BLOB, TREE
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.objects import CHUNKED
from medomni_cas.store.store import Store
from medomni_cas.store.trees import NodeCache, iter_tree
from medomni_cas.studio.arms import arm_label
from medomni_cas.studio.records import SetBuild, TaskSetRecord
from medomni_cas.studio.refnames import TASK_SET_REFS, set_build_ref, task_set_ref
from medomni_cas.view.confusion import confusion_html
from medomni_cas.view.contrasts import (
    COMPARISON_KIND,
    COMPARISON_REFS,
    comparison_of_set,
    contrast_table,
    plots_html,
    read_comparison,
)
from medomni_cas.view.fields import describe, plain
from medomni_cas.view.html import (
    Html,
    esc,
    kv_table,
    link,
    num,
    obj_link,
    pager,
    table,
    url_part,
)
from medomni_cas.view.lineage import Node, lineage
from medomni_cas.view.queries import (
    PAGE,
    Hidden,
    JobHead,
    Preview,
    build_atom_count,
    job_head,
    patients,
    preview,
    ref_page,
    run_page,
)

__all__ = [
    "Context",
    "Page",
    "PageError",
    "blob_page",
    "comparison_page",
    "comparisons_page",
    "index_page",
    "job_page",
    "jobs_page",
    "object_page",
    "provenance_page",
    "resolve",
    "refs_page",
    "result_of",
    "result_page",
    "results_page",
    "run_page_html",
    "taskset_page",
    "tasksets_page",
    "tree_page",
]

#: Where signed attestations of results and comparisons are kept, and their kind.
ATTESTATION_REFS = "attestations/"
ATTESTATION_KIND = "medomni.attestation"
#: Bytes of each log file shown on a run's page (the file's own page shows more).
LOG_BYTES = 16 << 10
#: Items of one list or map a generic object page shows.
ITEMS = 200
#: Bytes of a bytes field shown on an object's page.
PREVIEW = 64 << 10
#: Score rows shown at once on a result's page.
ROWS = 200
_RUN_HEAD = ["#", "run", "pair", "patient", "attempt", "outcome", "served model"]


@dataclass
class Context:
    """What every page reads: the store, and whether answers may be shown."""

    store: Store
    show_answer_keys: bool = False

    def __post_init__(self) -> None:
        self.hidden = Hidden(self.store)

    @property
    def guard(self) -> Hidden | None:
        """The answer filter, or None when answers are shown."""
        return None if self.show_answer_keys else self.hidden


@dataclass(frozen=True)
class Page:
    title: str
    body: Html
    status: int = 200


class PageError(Exception):
    """A page that cannot be shown: its status and a message naming what is at fault."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def resolve(ctx: Context, spec: str) -> ObjectId:
    """The id ``spec`` names (an id, a prefix, a ref name); `PageError` 404 naming it."""
    try:
        return ctx.store.resolve(spec)
    except AmbiguousId as e:
        raise PageError(404, "Ambiguous id", str(e)) from None
    except (NotFound, InvalidId, InvalidName):
        raise PageError(404, "Not found", f"no object or ref {spec!r} in this store") from None


def _raw(ctx: Context, oid: ObjectId) -> tuple[bytes, str]:
    try:
        data = ctx.store.get_raw(oid)
    except NotFound:
        raise PageError(404, "Not found", f"no object {oid.hex()} in this store") from None
    kind = encoding.kind_of(data)[0]
    guard = ctx.guard
    if guard is not None and (why := guard.reason(oid, kind)):
        raise PageError(
            403,
            "Hidden",
            f"object {oid.hex()} is {why}: the viewer shows answers only when started "
            "with --show-answer-keys",
        )
    return data, kind


def _typed[T](ctx: Context, spec: str, cls: type[T], what: str) -> tuple[ObjectId, T]:
    oid = resolve(ctx, spec)
    data, kind = _raw(ctx, oid)
    try:
        return oid, encoding.decode_body(data, cls)
    except InvalidObject:
        raise PageError(404, "Not found", f"object {oid.hex()} is a {kind}, not {what}") from None


def result_of(ctx: Context, spec: str) -> tuple[ObjectId, Result]:
    """The `Result` ``spec`` names (a `PageError` when it names something else)."""
    return _typed(ctx, spec, Result, "a result")


def _answer_link(ctx: Context, oid: ObjectId) -> Html:
    mark = "" if ctx.show_answer_keys else ' <span class="hidden">(hidden)</span>'
    return obj_link(oid) + mark


def _errors(errors: Iterable[str], limit: int = 160) -> Html:
    shown = [e if len(e) <= limit else e[:limit] + "…" for e in errors]
    return "<br>".join(esc(e) for e in shown)


# -- overview and lists -------------------------------------------------------------------------
def index_page(ctx: Context) -> Page:
    store = ctx.store
    sets, n_sets = ref_page(store, TASK_SET_REFS, 0, 20)
    results, n_results = ref_page(store, RESULT_REFS, 0, 20)
    _, n_jobs = ref_page(store, JOB_REFS, 0, 0)
    _, n_comparisons = ref_page(store, COMPARISON_REFS, 0, 0)
    body = [
        kv_table(
            [
                ("store", esc(store.url)),
                ("task sets", link("/tasksets", f"{n_sets:,}")),
                ("results", link("/results", f"{n_results:,}")),
                ("comparisons", link("/comparisons", f"{n_comparisons:,}")),
                ("jobs", link("/jobs", f"{n_jobs:,}")),
                ("answers", "shown" if ctx.show_answer_keys else "hidden"),
            ]
        ),
        "<h2>Task sets</h2>",
        _set_rows(sets) or '<p class="muted">none</p>',
        "<h2>Results</h2>",
        _result_rows(ctx, results) or '<p class="muted">none</p>',
    ]
    return Page("Overview", "".join(body))


def _set_rows(refs: list[tuple[str, ObjectId]]) -> Html:
    if not refs:
        return ""
    rows = []
    for name, oid in refs:
        short = name.removeprefix(TASK_SET_REFS)
        rows.append([link(f"/taskset/{url_part(short)}", short), obj_link(oid)])
    return table(["task set", "id"], rows)


def tasksets_page(ctx: Context, offset: int, limit: int) -> Page:
    refs, total = ref_page(ctx.store, TASK_SET_REFS, offset, limit)
    rows = []
    for name, oid in refs:
        short = name.removeprefix(TASK_SET_REFS)
        try:
            ts = ctx.store.get(oid, TaskSetRecord)
            arms, pairs = ", ".join(ts.arms), f"{len(ts.pairs):,}"
        except (InvalidObject, NotFound) as e:
            arms, pairs = f"unreadable: {e}", "-"
        rows.append([link(f"/taskset/{url_part(short)}", short), obj_link(oid), esc(arms), pairs])
    body = pager("/tasksets", offset, limit, total) + table(
        ["task set", "id", "arms", "pairs"], rows
    )
    return Page("Task sets", body if rows else '<p class="muted">none</p>')


def taskset_page(ctx: Context, name: str) -> Page:
    store = ctx.store
    try:
        oid = store.refs.get(task_set_ref(name)) if _ref_name_ok(name) else None
    except InvalidName:
        oid = None
    if oid is None:
        raise PageError(404, "Not found", f"no task set {name!r} in this store")
    ts = store.get(oid, TaskSetRecord)
    body = [
        kv_table(
            [
                ("name", esc(ts.name)),
                ("task set hash", obj_link(oid, oid.hex())),
                ("builder", esc(ts.builder)),
                ("arms", esc(", ".join(ts.arms))),
            ]
        ),
        "<h2>Pairs</h2>",
        table(["pair", "N"], [[esc(p.task), num(p.n)] for p in ts.pairs]),
    ]
    sb_id = store.refs.get(set_build_ref(name))
    if sb_id is not None:
        sb = store.get(sb_id, SetBuild)
        rows = [
            [
                esc(e.pair),
                esc(e.version),
                esc(arm_label(e.arm, e.arm_variant)),
                obj_link(e.config),
                obj_link(e.result),
                num(build_atom_count(store, e.result)),
            ]
            for e in sb.entries
        ]
        body += [
            f"<h2>Set build {obj_link(sb_id)}</h2>",
            table(["pair", "version", "arm", "config hash", "build", "atom tasks"], rows),
        ]
    result = store.refs.get(result_ref(name))
    body.append("<h2>Scores</h2>")
    if result is None:
        body.append('<p class="muted">not scored yet</p>')
    else:
        history = store.refs.history(result_ref(name))
        rows = [
            [
                link(f"/result/{e.new.hex()}", e.new.hex()[:12]) if e.new else "-",
                esc(_time(e.time)),
                esc(e.message),
            ]
            for e in reversed(history)
        ]
        body.append(f"<p>latest: {link(f'/result/{result.hex()}', result.hex())}</p>")
        body.append(table(["result", "when", "message"], rows))
    return Page(f"Task set {ts.name}", "".join(body))


def _time(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _ref_name_ok(name: str) -> bool:
    return bool(name) and ".." not in name.split("/") and not name.startswith("/")


def results_page(ctx: Context, offset: int, limit: int) -> Page:
    refs, total = ref_page(ctx.store, RESULT_REFS, offset, limit)
    body = pager("/results", offset, limit, total) + (
        _result_rows(ctx, refs) or '<p class="muted">none</p>'
    )
    return Page("Results", body)


def _result_rows(ctx: Context, refs: list[tuple[str, ObjectId]]) -> Html:
    if not refs:
        return ""
    rows = []
    for name, oid in refs:
        short = name.removeprefix(RESULT_REFS)
        try:
            r = ctx.store.get(oid, Result)
            info = [
                esc(f"{r.scorer} {r.scorer_version}"),
                num(len(r.rows)),
                num(len(r.jobs)),
                "partial" if r.partial else "",
            ]
        except (InvalidObject, NotFound) as e:
            info = [esc(f"unreadable: {e}"), "", "", ""]
        set_link = link(f"/taskset/{url_part(short)}", short)
        rows.append([set_link, link(f"/result/{oid.hex()}", oid.hex()[:12]), *info])
    return table(["task set", "result", "scorer", "rows", "jobs", ""], rows)


def jobs_page(ctx: Context, offset: int, limit: int) -> Page:
    refs, total = ref_page(ctx.store, JOB_REFS, offset, limit)
    body = pager("/jobs", offset, limit, total) + (
        _job_rows(ctx, [oid for _, oid in refs]) or '<p class="muted">none</p>'
    )
    return Page("Jobs", body)


def _agent_names(store: Store, ids: Iterable[ObjectId]) -> dict[ObjectId, str]:
    out = {}
    for oid, data in store.get_raw_many(list(dict.fromkeys(ids)), allow_missing=True):
        if data is not None:
            try:
                out[oid] = encoding.decode_body(data, AgentConfig).name
            except InvalidObject:
                continue
    return out


def _job_rows(ctx: Context, ids: list[ObjectId]) -> Html:
    if not ids:
        return ""
    heads: list[tuple[ObjectId, JobHead]] = []
    for oid in ids:
        try:
            heads.append((oid, job_head(ctx.store, oid)))
        except (InvalidObject, NotFound):
            continue
    names = _agent_names(ctx.store, [h.agent_config for _, h in heads])
    rows = [
        [
            link(f"/job/{oid.hex()}", h.name),
            esc(names.get(h.agent_config, h.agent_config.hex()[:12])),
            esc(arm_label(h.arm, h.arm_variant)),
            num(h.repetition),
            esc(h.runner),
            num(h.run_count),
            num(h.attempts),
            esc(h.started),
        ]
        for oid, h in heads
    ]
    return table(["job", "agent", "arm", "rep", "runner", "runs", "attempts", "started"], rows)


def refs_page(ctx: Context, prefix: str, offset: int, limit: int) -> Page:
    refs, total = ref_page(ctx.store, prefix, offset, limit)
    rows = [[esc(name), obj_link(oid, oid.hex())] for name, oid in refs]
    form = (
        '<form method="get" action="/refs"><input name="prefix" value="'
        f'{esc(prefix)}" size="40"> <button>list</button></form>'
    )
    body = form + pager("/refs", offset, limit, total, prefix=prefix)
    body += table(["ref", "id"], rows) if rows else '<p class="muted">none</p>'
    return Page(f"Refs {prefix}" if prefix else "Refs", body)


def comparisons_page(ctx: Context, offset: int, limit: int) -> Page:
    """The paired contrasts kept under ``comparisons/``, each with its kind and name."""
    refs, total = ref_page(ctx.store, COMPARISON_REFS, offset, limit)
    rows = []
    for name, oid in refs:
        try:
            data = ctx.store.get_raw(oid)
            kind, _, body = encoding.decode(data)
            label = describe(kind, plain(body))
        except (InvalidObject, NotFound) as e:
            kind, label = "?", f"unreadable: {e}"
        rows.append(
            [
                esc(name.removeprefix(COMPARISON_REFS)),
                obj_link(oid),
                esc(label),
                link(f"/provenance/{oid.hex()}", "provenance"),
            ]
        )
    if not rows:
        return Page("Comparisons", '<p class="muted">no comparisons in this store</p>')
    head = ["comparison", "id", "object", ""]
    return Page("Comparisons", pager("/comparisons", offset, limit, total) + table(head, rows))


# -- results ------------------------------------------------------------------------------------
def result_page(ctx: Context, spec: str, offset: int = 0, limit: int = ROWS) -> Page:
    oid, r = _typed(ctx, spec, Result, "a result")
    store = ctx.store
    ts_name = ""
    try:
        ts_name = store.get(r.task_set, TaskSetRecord).name
        ts_html = link(f"/taskset/{url_part(ts_name)}", ts_name) + " " + obj_link(r.task_set)
    except (InvalidObject, NotFound):
        ts_html = obj_link(r.task_set)
    body = [
        kv_table(
            [
                ("result", esc(oid.hex())),
                ("task set", ts_html),
                ("set build", obj_link(r.set_build)),
                ("scorer", esc(f"{r.scorer} {r.scorer_version}")),
                ("bootstrap", esc(f"n_boot {r.n_boot}, seed {r.seed}")),
                ("arms scored", esc(", ".join(r.arms) or "every arm of the set")),
                ("partial", "yes" if r.partial else "no"),
                ("score table", obj_link(r.table)),
                ("answer keys", " ".join(_answer_link(ctx, k) for k in r.answer_keys)),
                ("answer columns", " ".join(obj_link(c) for c in r.answer_columns)),
            ]
        ),
        f"<p>{link(f'/provenance/{oid.hex()}', 'provenance of this result')}</p>",
        "<h2>Scores</h2>",
        pager(f"/result/{oid.hex()}", offset, limit, len(r.rows)),
        _score_table(r.rows[offset : offset + limit]),
        "<h2>Contrasts</h2>",
        _contrasts_of(ctx, ts_name, r.task_set),
        "<h2>Confusion</h2>",
        confusion_html(oid, r) or '<p class="muted">no class target</p>',
        _attestations_html(ctx, oid),
        "<h2>Jobs</h2>",
        _job_rows(ctx, list(r.jobs)) or '<p class="muted">none</p>',
    ]
    return Page(f"Result {oid.hex()[:12]}", "".join(body))


def _contrasts_of(ctx: Context, set_name: str, task_set: ObjectId) -> Html:
    """The set's latest comparison, when it compares this result's task set."""
    found = comparison_of_set(ctx.store, set_name, task_set) if set_name else None
    if found is None:
        hint = f"medomni bench compare {set_name}" if set_name else "medomni bench compare"
        return f'<p class="muted">no comparison of these arms yet ({esc(hint)})</p>'
    cid, values = found
    rows = values.get("rows") or []
    return (
        f"<p>comparison {link(f'/comparison/{cid.hex()}', cid.hex()[:12])}: "
        f"{len(rows):,} contrasts, {esc(values.get('comparer', ''))} "
        f"{esc(values.get('comparer_version', ''))}; "
        f"{link(f'/provenance/{cid.hex()}', 'provenance of the contrasts')}</p>"
        + contrast_table(rows)
        + plots_html(cid, rows)
    )


def comparison_page(ctx: Context, spec: str) -> Page:
    """A comparison: what it was computed from, its contrasts and its plots."""
    oid = resolve(ctx, spec)
    _raw(ctx, oid)
    values = read_comparison(ctx.store, oid)
    if values is None:
        raise PageError(404, "Not found", f"object {oid.hex()} is not a comparison")
    rows = values.get("rows") or []
    fields = [
        ("comparison", esc(oid.hex())),
        ("provenance", link(f"/provenance/{oid.hex()}", "links followed down")),
    ]
    for name, value in values.items():
        if name == "rows":
            continue
        if name == "answer_keys":
            shown = " ".join(_answer_link(ctx, k) for k in value if isinstance(k, ObjectId))
        elif name == "jobs":
            shown = " ".join(link(f"/job/{j.hex()}", j.hex()[:12]) for j in value)
        else:
            shown = _value_html(ctx, value, 1)
        fields.append((name, shown))
    body = kv_table(fields) + "<h2>Contrasts</h2>" + contrast_table(rows)
    body += "<h2>Plots</h2>" + (plots_html(oid, rows) or '<p class="muted">none</p>')
    return Page(f"Comparison {oid.hex()[:12]}", body + _attestations_html(ctx, oid))


def _signed_result(envelope: object) -> str:
    """The predicate's ``result`` in a DSSE envelope's in-toto statement, or ``?``."""
    import base64
    import json

    try:
        doc = json.loads(envelope)  # type: ignore[arg-type]  # bytes, or an error below
        statement = json.loads(base64.b64decode(doc["payload"], validate=True))
        return str(statement["predicate"]["result"])
    except (TypeError, ValueError, KeyError):
        return "?"


def _attestations_html(ctx: Context, subject: ObjectId) -> Html:
    """The signed attestations the ``attestations/`` refs hold of ``subject`` (as their
    records say; `medomni audit verify-attestation` checks the signatures)."""
    rows = []
    for name, aid in ctx.store.refs.items(ATTESTATION_REFS):
        try:
            kind, _, body = encoding.decode(ctx.store.get_raw(aid))
        except (InvalidObject, NotFound):
            continue
        values = plain(body)
        if kind != ATTESTATION_KIND or not isinstance(values, dict):
            continue
        if values.get("subject") != subject:
            continue
        rows.append(
            [
                esc(name),
                obj_link(aid),
                esc(values.get("keyid", "")),
                esc(values.get("predicate_type", "")),
                esc(_signed_result(values.get("envelope"))),
            ]
        )
    if not rows:
        return ""
    note = (
        '<p class="muted">as the records say; the signatures are checked by '
        "<code>medomni audit verify-attestation</code></p>"
    )
    head = ["ref", "attestation", "key id", "predicate", "result signed"]
    return "<h2>Attestations</h2>" + note + table(head, rows)


def _score_table(rows: Iterable[ScoreRow]) -> Html:
    out = []
    for r in rows:
        ci = f"[{num(r.ci_low)}, {num(r.ci_high)}]" if r.ci_low is not None else ""
        cover = f"{r.answered:,}/{r.expected:,}" if r.expected else ""
        flags = "; ".join(f for f in (r.config_flag, r.run_flag) if f)
        out.append(
            [
                esc(r.agent),
                esc(arm_label(r.arm, r.arm_variant)),
                esc(r.pair),
                esc(r.target),
                esc(r.metric),
                num(r.value),
                ci,
                num(r.n),
                num(r.n_missing),
                cover + (" partial" if r.partial else ""),
                f'<code title="{esc(r.config)}">{esc(r.config[:12])}</code>',
                f'<span class="warn">{esc(flags)}</span>' if flags else "",
            ]
        )
    head = ["agent", "arm", "pair", "target", "metric", "value", "95% CI", "n", "missing"]
    return table([*head, "answered", "config", "flags"], out)


def provenance_page(ctx: Context, spec: str) -> Page:
    oid = resolve(ctx, spec)
    _raw(ctx, oid)  # a hidden object has no provenance page either
    root = lineage(ctx.store, oid, ctx.guard)
    return Page(f"Provenance of {oid.hex()[:12]}", f'<ul class="tree">{_tree_html(root)}</ul>')


def _tree_html(node: Node) -> Html:
    where = f'<span class="muted">{esc(node.field)}</span> ' if node.field else ""
    if node.id is None:
        head = where + link(node.href, node.label)
    else:
        href = node.href or f"/object/{node.id.hex()}"
        head = (
            where
            + f'<a href="{esc(href)}" title="{esc(node.id.hex())}">{esc(node.label)}</a> '
            + f"<code>{esc(node.id.hex()[:12])}</code>"
        )
    if node.note:
        cls = "hidden" if node.note.startswith("hidden") else "muted"
        head += f' <span class="{cls}">({esc(node.note)})</span>'
    kids = "".join(_tree_html(c) for c in node.children)
    return f"<li>{head}" + (f'<ul class="tree">{kids}</ul>' if kids else "") + "</li>"


# -- jobs and runs ------------------------------------------------------------------------------
def job_page(ctx: Context, spec: str, offset: int, limit: int) -> Page:
    oid = resolve(ctx, spec)
    _, kind = _raw(ctx, oid)
    if kind != JobRecord.__kind__:
        raise PageError(404, "Not found", f"object {oid.hex()} is a {kind}, not a job")
    store = ctx.store
    head = job_head(store, oid)
    runs, total = run_page(store, head, offset, limit)
    agent = _agent_names(store, [head.agent_config]).get(head.agent_config, "")
    who = patients(store, [r.atom for _, r in runs])
    rows = []
    for i, (rid, r) in enumerate(runs, start=offset + 1):
        tokens = "" if r.tokens_in is None else f"{r.tokens_in:,} / {r.tokens_out or 0:,}"
        rows.append(
            [
                num(i),
                link(f"/run/{rid.hex()}", rid.hex()[:12]),
                esc(r.pair),
                esc(who.get(r.atom, "")),
                num(r.attempt),
                esc(r.outcome),
                esc(r.served_model),
                tokens,
                num(r.cost_usd),
                num(r.agent_block.encoder_calls),
                num(r.elapsed_ms),
                _errors(r.errors[:1]),
            ]
        )
    body = [
        kv_table(
            [
                ("job", esc(oid.hex())),
                ("name", esc(head.name)),
                ("task set", obj_link(head.task_set)),
                ("set build", obj_link(head.set_build)),
                ("agent", obj_link(head.agent_config, agent or None)),
                ("arm", esc(arm_label(head.arm, head.arm_variant))),
                ("repetition", num(head.repetition)),
                ("runner", esc(head.runner)),
                ("runs", num(total)),
                ("attempts", num(head.attempts)),
                ("predictions", obj_link(head.predictions)),
                ("started", esc(head.started)),
            ]
        ),
        "<h2>Runs</h2>",
        pager(f"/job/{oid.hex()}", offset, limit, total),
        table(
            [*_RUN_HEAD, "tokens in / out", "cost $", "encoder calls", "ms", "error"],
            rows,
        ),
        pager(f"/job/{oid.hex()}", offset, limit, total),
    ]
    return Page(f"Job {head.name}", "".join(body))


def run_page_html(ctx: Context, spec: str) -> Page:
    oid, r = _typed(ctx, spec, RunRecord, "a run")
    store = ctx.store
    b = r.agent_block
    served = ", ".join(f"{e.name} {e.version} ({e.digest[:19]})" for e in b.encoders_served)
    body = [
        kv_table(
            [
                ("run", esc(oid.hex())),
                ("run id", esc(r.run_id)),
                ("outcome", esc(r.outcome)),
                ("attempt", num(r.attempt)),
                ("previous attempt", obj_link(r.previous) if r.previous else "-"),
                ("pair", esc(f"{r.pair} (version {r.task_version})")),
                ("atom task", obj_link(r.atom)),
                ("config hash", obj_link(r.config)),
                ("task set", obj_link(r.task_set) if r.task_set else "-"),
                ("agent config", obj_link(r.agent_config)),
                ("repetition", num(r.repetition)),
                ("runner", esc(r.runner)),
                ("environment", esc(f"{r.environment or '-'}, isolation {r.isolation or '-'}")),
                ("served model", esc(r.served_model or "(not reported)")),
                ("tokens in / out", f"{num(r.tokens_in)} / {num(r.tokens_out)}"),
                ("cost $", num(r.cost_usd)),
                ("started", esc(r.started)),
                ("finished", esc(f"{r.finished} ({r.elapsed_ms:,} ms)")),
            ]
        ),
        "<h2>Agent block</h2>",
        kv_table(
            [
                ("arm", esc(arm_label(b.arm, b.arm_variant))),
                ("encoders", esc(b.encoders)),
                ("encoders served", esc(served or "none")),
                ("encoder calls", num(b.encoder_calls)),
                ("encoder log", obj_link(b.encoder_log) if b.encoder_log else "-"),
                ("meets the arm", esc("yes" if b.meets_arm else f"no: {b.meets_arm_reason}")),
                ("files opened", esc(", ".join(b.files_opened) or "-")),
            ]
        ),
    ]
    if r.errors:
        body += ["<h2>Errors</h2>", "<pre>" + esc("\n".join(r.errors)) + "</pre>"]
    body.append("<h2>Answer</h2>")
    if r.answer is None:
        body.append('<p class="muted">no answer</p>')
    else:
        body.append(f"<p>{obj_link(r.answer)}</p>" + _preview_html(preview(store, r.answer)))
    if r.predictions:
        preds = list(store.get_many(r.predictions, PredictionRecord))
        rows = [
            [obj_link(pid), esc(p.target), esc(p.value), esc(p.scores or "")] for pid, p in preds
        ]
        body += ["<h2>Predictions</h2>", table(["record", "target", "value", "scores"], rows)]
    body.append("<h2>Logs</h2>")
    if r.logs is None:
        body.append('<p class="muted">no logs</p>')
    else:
        body.append(_logs_html(store, r.logs))
    return Page(f"Run {r.run_id[:16]}", "".join(body))


def _logs_html(store: Store, logs: ObjectId) -> Html:
    files = list(iter_tree(store, logs))
    rows = []
    shown: list[str] = []
    for path, fid, _kind in files:
        p = preview(store, fid, LOG_BYTES)
        href = f"/tree/{logs.hex()}/{url_part(path)}"
        rows.append([link(href, path), num(p.size)])
        if len(shown) < 10:
            shown.append(f"<h3>{link(href, path)}</h3>" + _preview_html(p))
    listing = f"<p>tree {obj_link(logs)}</p>" + table(["file", "bytes"], rows)
    return listing + "".join(shown)


def _preview_html(p: Preview) -> Html:
    text = p.text
    more = f'<p class="muted">first {len(p.data):,} of {p.size:,} bytes</p>' if p.truncated else ""
    if text is not None:
        return f"<pre>{esc(text)}</pre>{more}"
    head = p.data[:4096]
    dump = "\n".join(f"{i:08x}  {head[i : i + 16].hex(' ')}" for i in range(0, len(head), 16))
    return f'<p class="muted">binary, {p.size:,} bytes</p><pre>{esc(dump)}</pre>'


# -- any object ---------------------------------------------------------------------------------
def object_page(ctx: Context, spec: str, params: Mapping[str, str]) -> Page:
    """Any object: by its kind's own page, or as its fields."""
    oid = resolve(ctx, spec)
    data, kind = _raw(ctx, oid)
    offset, limit = _int(params, "offset", 0), _int(params, "limit", PAGE)
    if kind == Result.__kind__:
        return result_page(ctx, oid.hex())
    if kind == JobRecord.__kind__:
        return job_page(ctx, oid.hex(), offset, limit)
    if kind == RunRecord.__kind__:
        return run_page_html(ctx, oid.hex())
    if kind == TREE:
        return tree_page(ctx, oid.hex(), "")
    if kind in (BLOB, CHUNKED):
        return blob_page(ctx, oid, f"Blob {oid.hex()[:12]}")
    if kind == COMPARISON_KIND:
        return comparison_page(ctx, oid.hex())
    if kind == TaskSetRecord.__kind__:
        name = encoding.decode_body(data, TaskSetRecord).name
        if ctx.store.refs.get(task_set_ref(name)) == oid:
            return taskset_page(ctx, name)
    try:
        _, version, body = encoding.decode(data)
    except InvalidObject as e:
        raise PageError(404, "Unreadable", f"object {oid.hex()}: {e}") from None
    values = plain(body)
    head = kv_table(
        [
            ("id", esc(oid.hex())),
            ("kind", esc(f"{kind} v{version}")),
            ("provenance", link(f"/provenance/{oid.hex()}", "links followed down")),
        ]
    )
    fields = "<h2>Fields</h2>" + _value_html(ctx, values, 0)
    return Page(describe(kind, values), head + fields + _attestations_html(ctx, oid))


def _int(params: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(params.get(name, default))
    except ValueError:
        return default


def _value_html(ctx: Context, value: Any, depth: int) -> Html:
    if isinstance(value, ObjectId):
        return obj_link(value)
    if isinstance(value, dict):
        if not value:
            return '<span class="muted">{}</span>'
        items = list(value.items())
        rows = [(str(k), _value_html(ctx, v, depth + 1)) for k, v in items[:ITEMS]]
        more = (
            f'<p class="muted">… and {len(items) - ITEMS:,} more</p>' if len(items) > ITEMS else ""
        )
        return kv_table(rows) + more
    if isinstance(value, list):
        if not value:
            return '<span class="muted">[]</span>'
        if all(isinstance(v, dict) for v in value):  # rows of a table (score rows, contrasts)
            return _rows_html(ctx, value, depth)
        cells = [f"<li>{_value_html(ctx, v, depth + 1)}</li>" for v in value[:ITEMS]]
        more = (
            f"<li class='muted'>… and {len(value) - ITEMS:,} more</li>"
            if len(value) > ITEMS
            else ""
        )
        return f"<ol start=0>{''.join(cells)}{more}</ol>"
    if isinstance(value, bytes):  # an envelope's JSON, say: text when it is
        text = Preview(value[:PREVIEW], len(value)).text
        if text is not None:
            more = f'<p class="muted">{len(value):,} bytes</p>' if len(value) > PREVIEW else ""
            return f"<pre>{esc(text)}</pre>{more}"
        return f"<code>{esc(value[:64].hex())}</code>" + (" …" if len(value) > 64 else "")
    if isinstance(value, str) and ("\n" in value or len(value) > 200):
        return f"<pre>{esc(value)}</pre>"
    if isinstance(value, float):
        return num(value, 6)
    return esc(msgspec.json.encode(value).decode() if value is None else value)


def _rows_html(ctx: Context, rows: list[dict[str, Any]], depth: int) -> Html:
    """A list of records as one table, a column per field any of them has."""
    head = list(dict.fromkeys(k for r in rows for k in r))
    cells = [
        [_value_html(ctx, r[k], depth + 1) if k in r else "" for k in head] for r in rows[:ITEMS]
    ]
    more = f'<p class="muted">… and {len(rows) - ITEMS:,} more</p>' if len(rows) > ITEMS else ""
    return table([str(h) for h in head], cells) + more


def tree_page(ctx: Context, spec: str, path: str) -> Page:
    """A folder inside a tree, or a file's contents: ``path`` is followed name by name."""
    root = resolve(ctx, spec)
    _raw(ctx, root)
    cache = NodeCache(ctx.store)
    oid, shown = root, ""
    crumbs = [link(f"/tree/{root.hex()}/", root.hex()[:12])]
    try:
        for name in [p for p in path.split("/") if p]:
            entries = cache.entries(oid, shown)
            if entries is None or name not in entries:
                raise PageError(404, "Not found", f"no {path!r} in tree {root.hex()}")
            oid = entries[name]
            shown = f"{shown}/{name}" if shown else name
            crumbs.append(link(f"/tree/{root.hex()}/{url_part(shown)}", name))
        node = cache.node(oid, shown)
    except InvalidObject as e:
        raise PageError(404, "Unreadable", f"tree {root.hex()}: {e}") from None
    trail = "<p>" + " / ".join(crumbs) + "</p>"
    if node.entries is None:
        page = blob_page(ctx, oid, shown or oid.hex()[:12])
        return Page(page.title, trail + page.body)
    nodes = cache.nodes((o, n) for n, o in node.entries.items())
    rows = []
    for name, child in sorted(node.entries.items()):
        sub = f"{shown}/{name}" if shown else name
        n = nodes[child]
        size = f"{n.size:,} entries" if n.kind == TREE else f"{n.size:,} bytes"
        rows.append(
            [
                link(f"/tree/{root.hex()}/{url_part(sub)}", name),
                esc(n.kind),
                esc(size),
                obj_link(child),
            ]
        )
    title = f"Tree {root.hex()[:12]}" + (f" / {shown}" if shown else "")
    return Page(title, trail + table(["name", "kind", "size", "id"], rows))


def blob_page(ctx: Context, oid: ObjectId, title: str) -> Page:
    _raw(ctx, oid)
    p = preview(ctx.store, oid)
    head = f"<p>{obj_link(oid, oid.hex())}, {p.size:,} bytes</p>"
    return Page(title, head + _preview_html(p))
