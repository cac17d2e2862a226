"""``python -m medomni_cas.schemas --out DIR [--pages DIR]``: write the JSON Schema files
(and the reference pages) of the files a user writes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from medomni_cas.schemas.files import FILES
from medomni_cas.schemas.json_schema import write_schemas
from medomni_cas.schemas.markdown import reference_index, reference_page

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m medomni_cas.schemas",
        description="Write <file>.schema.json for every file a user writes.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the schema files")
    parser.add_argument("--pages", type=Path, help="also write the reference pages here")
    args = parser.parse_args(argv)
    for path in write_schemas(args.out):
        print(path)
    if args.pages is not None:
        args.pages.mkdir(parents=True, exist_ok=True)
        schemas = Path(args.out).resolve()
        urls = {f.name: (schemas / f"{f.name}.schema.json").as_uri() for f in FILES}
        for f in FILES:
            page = args.pages / f"{f.name}.md"
            page.write_text(reference_page(f, schema_url=urls[f.name]), encoding="utf-8")
            print(page)
        index = args.pages / "index.md"
        index.write_text(
            reference_index(schema_folder=str(args.out), schema_urls=urls), encoding="utf-8"
        )
        print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
