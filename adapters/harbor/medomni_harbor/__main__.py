"""``python -m medomni_harbor images``: build the perception relay's image on the engine (no
registry).

Prints the tag and image id; the agent image (``local/base:1``) must be on the engine already
(``bash .ci/docker-engine image`` imports it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from medomni_harbor import images


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medomni_harbor")
    verbs = p.add_subparsers(dest="verb", required=True)
    b = verbs.add_parser("images", help="build the perception relay's image")
    b.add_argument("--docker-host", default=None, help="the engine (default: $DOCKER_HOST)")
    b.add_argument("--base", default=images.AGENT_IMAGE, help="the image it is built FROM")
    args = p.parse_args(argv)
    try:
        image = images.ensure_relay_image(args.docker_host, args.base)
    except Exception as e:
        print(f"medomni_harbor: {e}", file=sys.stderr)
        return 1
    print(f"{images.relay_tag(args.docker_host, args.base)} {image.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
