"""MkDocs hook: the reference pages and JSON Schema files, generated at build time.

Nothing under docs/reference/ or docs/schemas/ is written by hand: `on_files` adds the
pages and schema files that `medomni_cas.schemas` renders from the file-schema structs,
with the first example file of each kind in this repository.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from medomni_cas.schemas import FILES, UserFile, schema_text
from medomni_cas.schemas.markdown import reference_index, reference_page

__all__ = ["on_files"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _example(f: UserFile) -> tuple[str, str] | None:
    """The first example of a kind: the repository's own workspace.yaml, else examples/."""
    found = [
        ROOT / g.removeprefix("**/") for g in f.globs if (ROOT / g.removeprefix("**/")).is_file()
    ]
    found += sorted(p for g in f.globs for p in EXAMPLES.glob(g))
    if not found:
        return None
    return str(found[0].relative_to(ROOT)), found[0].read_text(encoding="utf-8")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    urls = {f.name: f"../schemas/{f.name}.schema.json" for f in FILES}
    for f in FILES:
        files.append(
            File.generated(config, f"schemas/{f.name}.schema.json", content=schema_text(f))
        )
        page = reference_page(f, schema_url=urls[f.name], example=_example(f))
        files.append(File.generated(config, f"reference/{f.name}.md", content=page))
    index = reference_index(schema_folder="./schemas", schema_urls=urls)
    files.append(File.generated(config, "reference/index.md", content=index))
    return files
