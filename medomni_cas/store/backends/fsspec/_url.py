"""Backend URLs: the scheme fsspec gets, the query options medomni takes, and s3 defaults.

A scheme fsspec knows and medomni does not (``s3``, ``gs``, ``az``…) is passed to fsspec
as is. ``fsspec+<proto>://rest`` reaches fsspec's ``<proto>`` for schemes that medomni
claims for itself (``fsspec+memory://`` is fsspec's in-memory filesystem, ``fsspec+file://``
its local one).

Query options:

``endpoint_url``
    s3's endpoint; also taken from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``.
``anon``
    ``1`` for anonymous access.
``conditional_writes``
    ``0`` to force single-writer refs on an S3-compatible server without conditional
    writes (``1`` to claim them on a filesystem medomni does not recognise).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

import fsspec

from medomni_cas.store.backends.fsspec._remote import CONCURRENCY

__all__ = ["QUERY_OPTIONS", "open_url", "parse_url"]

QUERY_OPTIONS = frozenset({"endpoint_url", "anon", "conditional_writes"})


def _flag(text: str, what: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"{what} must be 0 or 1, got {text!r}")


def parse_url(url: str) -> tuple[str, str, dict[str, Any], bool | None]:
    """``(protocol, rest, storage options, conditional_writes)`` of a backend URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a store URL (expected scheme://…): {url!r}")
    protocol = scheme.removeprefix("fsspec+")
    if not protocol:
        raise ValueError(f"{url!r}: fsspec+ needs a protocol, e.g. fsspec+memory://bucket/x")
    rest, _, query = rest.partition("?")
    given = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(given) - QUERY_OPTIONS
    if unknown:
        raise ValueError(
            f"{url!r}: unknown option(s) {sorted(unknown)}; known: {sorted(QUERY_OPTIONS)}"
        )
    options: dict[str, Any] = {}
    if "endpoint_url" in given:
        options["endpoint_url"] = given["endpoint_url"]
    if "anon" in given:
        options["anon"] = _flag(given["anon"], f"{url!r}: anon")
    conditional = given.get("conditional_writes")
    return (
        protocol,
        rest,
        options,
        None if conditional is None else _flag(conditional, f"{url!r}: conditional_writes"),
    )


def open_url(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str, bool | None]:
    """The filesystem and root of ``url`` (``storage_options`` over its query options), and
    the ``conditional_writes`` the URL asks for (None: detect)."""
    protocol, rest, options, conditional = parse_url(url)
    options.update(storage_options or {})
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options.setdefault("endpoint_url", endpoint)
        # several processes share refs: a cached listing or ETag would be stale
        options.setdefault("use_listings_cache", False)
        # botocore's standard retry mode (jittered backoff, 3 attempts) rather than its
        # legacy one: an endpoint that cannot be reached fails in seconds, not a minute
        options.setdefault(
            "config_kwargs",
            {
                "max_pool_connections": CONCURRENCY,
                "retries": {"max_attempts": 3, "mode": "standard"},
                "connect_timeout": 10,
            },
        )
    fs, root = fsspec.url_to_fs(f"{protocol}://{rest}", **options)
    return fs, root, conditional
