"""The viewer's web app: read-only routes over one store (Starlette, the ``view`` extra).

Read-only
    Every route answers GET and HEAD only (anything else is 405), and no page function
    writes: the store is opened without creating one and only read.

Safe to open
    Every page is escaped HTML (`medomni_cas.view.html`) with no script; the responses
    forbid scripts, frames and plug-ins (Content-Security-Policy) and content sniffing.
    Requests must name the host the viewer was started on (a loopback name by default), so
    a web page elsewhere cannot read the store through a rebound DNS name.

Routes
    ``/`` overview; ``/tasksets``, ``/taskset/<name>``; ``/results``, ``/result/<id>``;
    ``/comparisons``, ``/comparison/<id>``, ``/plot/<id>/<forest|ladder>.svg``;
    ``/confusion/<result>/<n>.svg`` (a result's n-th class target: counts only);
    ``/jobs``, ``/job/<id>?offset=&limit=``; ``/run/<id>``;
    ``/object/<id|prefix|ref>`` (any object, by its kind); ``/tree/<id>/<path>``;
    ``/provenance/<id|ref>``; ``/refs?prefix=``; ``/health``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from medomni_cas._extras import require
from medomni_cas.errors import IntegrityError, InvalidObject, MedomniError, NotFound
from medomni_cas.store.store import Store
from medomni_cas.view import pages
from medomni_cas.view.confusion import ConfusionCache
from medomni_cas.view.contrasts import PlotCache, rows_of
from medomni_cas.view.html import esc, layout
from medomni_cas.view.pages import Context, Page, PageError
from medomni_cas.view.queries import PAGE, clamp

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["HEADERS", "LOOPBACK_HOSTS", "make_app"]

#: Host names a request may use when the viewer listens on loopback.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Sent with every page: no script, frame, plug-in or form target elsewhere; no sniffing.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

PageFn = Callable[[Context, "Request"], Page]


def _web() -> None:
    require("starlette", "view", "medomni view")


def _html(page: Page) -> Response:
    from starlette.responses import HTMLResponse

    return HTMLResponse(layout(page.title, page.body), status_code=page.status, headers=HEADERS)


def _error(status: int, title: str, message: str) -> Response:
    return _html(Page(title, f'<p class="warn">{esc(message)}</p>', status))


def _page(ctx: Context, fn: PageFn) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint that renders ``fn``'s page, its `PageError` as an error page.

    The store is read in the event loop's thread, one request at a time: the pages read
    little, and the store's readers need no locking this way (only drawing a plot, which
    reads no store, runs in a worker thread).
    """

    async def endpoint(request: Request) -> Response:
        try:
            return _html(fn(ctx, request))
        except PageError as e:
            return _error(e.status, e.title, e.message)
        except IntegrityError as e:
            return _error(500, "Corrupt object", str(e))
        except (NotFound, InvalidObject) as e:
            return _error(404, "Not found", str(e))
        except MedomniError as e:
            return _error(500, "Error", str(e))

    return endpoint


def _paging(request: Request) -> tuple[int, int]:
    q = request.query_params

    def number(name: str, default: int) -> int:
        try:
            return int(q.get(name, default))
        except ValueError:
            return default

    return clamp(number("offset", 0), number("limit", PAGE))


def _param(request: Request, name: str) -> str:
    return str(request.path_params[name])


def make_app(
    store: Store,
    *,
    show_answer_keys: bool = False,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
    plots: PlotCache | None = None,
) -> Starlette:
    """The viewer over ``store``; requests must name one of ``hosts`` (``"*"``: any).
    ``plots`` keeps the comparisons' plots once drawn (default: a cache of its own; the
    viewer's command passes the one it warms, `Warming`)."""
    _web()
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    ctx = Context(store, show_answer_keys=show_answer_keys)

    def get(path: str, fn: PageFn) -> Route:
        return Route(path, _page(ctx, fn), methods=["GET", "HEAD"])

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok", headers=HEADERS)

    plots = PlotCache() if plots is None else plots

    async def plot(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import Response

        name = _param(request, "name")
        try:
            oid = pages.resolve(ctx, _param(request, "id"))
            done, svg = plots.cached(oid, name)
            if not done:
                rows = rows_of(store, oid)
                if rows is None:
                    return _error(404, "Not found", f"object {oid.hex()} is not a comparison")
                svg = await run_in_threadpool(plots.draw, oid, name, rows)
        except PageError as e:
            return _error(e.status, e.title, e.message)
        except ModuleNotFoundError as e:  # the compare extra draws plots
            return _error(404, "No plots", f"plots need matplotlib: {e}")
        if svg is None:
            return _error(404, "Not found", f"no plot {name!r} of {oid.hex()}")
        return Response(svg, media_type="image/svg+xml", headers=HEADERS)

    confusion = ConfusionCache()

    async def confusion_panel(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import Response

        try:
            oid, result = pages.result_of(ctx, _param(request, "id"))
            n = int(_param(request, "n"))
            # reads the result's predictions (seconds for millions of rows): in a worker
            # thread, as the scorer's readers are, so other pages are served meanwhile
            svg = await run_in_threadpool(confusion.panel_svg, store, oid, result, n)
        except PageError as e:
            return _error(e.status, e.title, e.message)
        except (NotFound, InvalidObject) as e:
            return _error(404, "Not found", str(e))
        except MedomniError as e:
            return _error(500, "Error", str(e))
        if svg is None:
            return _error(404, "Not found", f"no confusion panel {n} of result {oid.hex()}")
        return Response(svg, media_type="image/svg+xml", headers=HEADERS)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            return _error(404, "Not found", f"no page {request.url.path!r}")
        if status == 405:
            response = _error(405, "Read-only", f"the viewer only reads: {request.method} refused")
            response.headers["Allow"] = "GET, HEAD"
            return response
        return _error(status, "Error", str(getattr(exc, "detail", exc)))

    routes = [
        get("/", lambda c, r: pages.index_page(c)),
        Route("/health", health, methods=["GET", "HEAD"]),
        get("/tasksets", lambda c, r: pages.tasksets_page(c, *_paging(r))),
        get("/taskset/{name:path}", lambda c, r: pages.taskset_page(c, _param(r, "name"))),
        get("/results", lambda c, r: pages.results_page(c, *_paging(r))),
        get(
            "/result/{id}",
            lambda c, r: pages.result_page(
                c, _param(r, "id"), _paging(r)[0], clamp(0, _limit(r, pages.ROWS))[1]
            ),
        ),
        get("/comparisons", lambda c, r: pages.comparisons_page(c, *_paging(r))),
        get("/comparison/{id}", lambda c, r: pages.comparison_page(c, _param(r, "id"))),
        Route("/plot/{id}/{name}.svg", plot, methods=["GET", "HEAD"]),
        Route("/confusion/{id}/{n:int}.svg", confusion_panel, methods=["GET", "HEAD"]),
        get("/jobs", lambda c, r: pages.jobs_page(c, *_paging(r))),
        get("/job/{id}", lambda c, r: pages.job_page(c, _param(r, "id"), *_paging(r))),
        get("/run/{id}", lambda c, r: pages.run_page_html(c, _param(r, "id"))),
        get(
            "/object/{spec:path}",
            lambda c, r: pages.object_page(c, _param(r, "spec"), dict(r.query_params)),
        ),
        get("/tree/{id}", lambda c, r: pages.tree_page(c, _param(r, "id"), "")),
        get(
            "/tree/{id}/{path:path}",
            lambda c, r: pages.tree_page(c, _param(r, "id"), _param(r, "path")),
        ),
        get("/provenance/{spec:path}", lambda c, r: pages.provenance_page(c, _param(r, "spec"))),
        get(
            "/refs",
            lambda c, r: pages.refs_page(c, r.query_params.get("prefix", ""), *_paging(r)),
        ),
    ]
    handlers: dict[Any, Any] = {HTTPException: http_error}
    return Starlette(
        routes=routes,
        exception_handlers=handlers,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))],
    )


def _limit(request: Request, default: int) -> int:
    try:
        return int(request.query_params.get("limit", default))
    except ValueError:
        return default
