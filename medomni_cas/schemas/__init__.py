"""The files a user writes, as JSON Schema files and reference pages, from their msgspec structs.

``python -m medomni_cas.schemas --out DIR`` writes ``DIR/<file>.schema.json`` for each kind
(`FILES`); ``--pages DIR`` writes the reference pages too. The docs site builds its reference
from the same functions, so neither can drift from the structs the loaders use.
"""

from medomni_cas.schemas.files import FILES, UserFile, WorkspaceFile, user_file
from medomni_cas.schemas.json_schema import json_schema, schema_text, write_schemas

__all__ = [
    "FILES",
    "UserFile",
    "WorkspaceFile",
    "json_schema",
    "schema_text",
    "user_file",
    "write_schemas",
]
