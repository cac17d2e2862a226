"""``medomni view``: the read-only results viewer in the browser, over the workspace's store.

``medomni view [--port P] [--host H] [--store URL] [--show-answer-keys]`` listens on
127.0.0.1:8765 by default and serves until interrupted. Answer keys (and the answer
columns derived from them) are shown only with ``--show-answer-keys``. A store that does
not exist, or a host or port it cannot listen on, exits 2 naming it.
"""

from __future__ import annotations

import argparse
import sys

from medomni_cas import porcelain
from medomni_cas.cli._output import EXIT_OK, add_command, open_store
from medomni_cas.view.server import DEFAULT_HOST, DEFAULT_PORT

__all__ = ["register"]


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0 to 65535): {value!r}")
    return port


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the viewer until interrupted (Ctrl-C)."""

    def ready(url: str) -> None:
        answers = "shown" if args.show_answer_keys else "hidden"
        print(f"medomni view: {url} (answer keys {answers}; Ctrl-C stops)", flush=True)
        if args.host not in (DEFAULT_HOST, "localhost", "::1"):
            print(
                f"medomni view: listening on {args.host}: reachable beyond this machine",
                file=sys.stderr,
                flush=True,
            )

    with open_store(args) as store:
        try:
            porcelain.view(
                store,
                host=args.host,
                port=args.port,
                show_answer_keys=args.show_answer_keys,
                ready=ready,
            )
        except KeyboardInterrupt:  # Ctrl-C is how a viewer ends: uvicorn stopped cleanly
            print("medomni view: stopped", file=sys.stderr, flush=True)
    return EXIT_OK


def register(groups: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``view`` to the top-level subcommands."""
    p = add_command(groups, "view", cmd_view, "browse results, jobs, runs and provenance")
    p.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        metavar="P",
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="H",
        help=f"address to listen on (default {DEFAULT_HOST}, this machine only)",
    )
    p.add_argument(
        "--show-answer-keys",
        action="store_true",
        help="also show answer keys and the answer columns made from them (hidden by default: "
        "an agent on this machine could read them)",
    )
