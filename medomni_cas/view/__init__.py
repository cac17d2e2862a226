"""``medomni view``: a local, read-only results viewer in the browser, over one store.

Task sets and their pairs, arms and config hashes; results with their score rows, and the
set's paired contrasts between arms with their forest and ladder plots; jobs and their runs,
paged (a page of a 100,000-run job reads that page's runs only); a run's
answer, predictions and logs; any object by its id, and the provenance tree of any object,
each node linking to the object it names. Answer keys are never shown unless asked for.

Modules
-------
``queries``  what the pages read from the store, a page at a time; what is hidden
``fields``   any object as plain values and its links
``lineage``  the provenance tree of an object
``contrasts`` a comparison's contrasts and plots
``confusion`` a result's per-class confusion, as SVG
``html``     escaping, the layout, tables and pagers
``pages``    one function per page
``app``      the Starlette app: routes, error pages, headers (the ``view`` extra)
``server``   binding a socket and serving it with uvicorn
"""

from __future__ import annotations

from medomni_cas.view.app import make_app
from medomni_cas.view.server import DEFAULT_HOST, DEFAULT_PORT, BindError, bind, serve, serving

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "BindError", "bind", "make_app", "serve", "serving"]
