"""Template sign-off: a template is frozen once its proposal is signed off.

``medomni studio template signoff <template>`` stores a `TemplateRecord` (the template file's
content and the version of each of its cohorts) and points ``studio/signoff/<template>`` at
it. From then on, Build refuses a changed template unless every cohort it builds rose past
its signed-off version: N when the targets (labels, metrics) changed, else X. Signing off
again after such a rise moves the ref and freezes the new text.
"""

from __future__ import annotations

from typing import Any

import msgspec

from medomni_cas.store import encoding
from medomni_cas.store.ids import ObjectId
from medomni_cas.store.store import Store
from medomni_cas.studio.errors import VersionError
from medomni_cas.studio.folders import TemplateFolder
from medomni_cas.studio.records import TemplateRecord
from medomni_cas.studio.refnames import signoff_ref
from medomni_cas.studio.schema import Version

__all__ = ["check_signoff", "signoff", "template_record"]

# template fields whose change makes results incomparable (they hold the labels and scoring)
_COMPARABILITY = ("targets",)


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=str)


def template_record(folder: TemplateFolder) -> TemplateRecord:
    rec = TemplateRecord(
        name=folder.name,
        dataset=folder.dataset.name,
        template=_builtins(folder.template),
        cohorts={name: str(c.version) for name, c in sorted(folder.cohorts.items())},
    )
    # a round trip makes it equal to one read back from the store (lists, not tuples)
    return encoding.decode_body(encoding.encode(rec), TemplateRecord)


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def check_signoff(store: Store, folder: TemplateFolder, cohorts: list[str] | None = None) -> None:
    """Refuse to build ``cohorts`` (default: all) of a signed-off template that changed
    without the version rise it needs; a `VersionError` names the field and the cohort."""
    signed = store.refs.get(signoff_ref(folder.name))
    if signed is None:
        return
    old = store.get(signed, TemplateRecord)
    new = template_record(folder).template
    changed = _changed(old.template, new)
    if not changed:
        return
    field = next((f for f in changed if f in _COMPARABILITY), changed[0])
    for name in cohorts if cohorts is not None else sorted(folder.cohorts):
        was = old.cohorts.get(name)
        if was is None:
            continue  # a cohort added after sign-off starts at its own version
        ov, nv = Version.parse(was), folder.cohorts[name].version
        if field in _COMPARABILITY and nv.n <= ov.n:
            needed = f"{ov.n + 1}.0"
        elif nv <= ov:
            needed = f"{ov.n}.{ov.x + 1}"
        else:
            continue
        raise VersionError(
            f"{folder.name}@{name}", f"template.{field} (signed off)", was, str(nv), needed
        )


def signoff(store: Store, folder: TemplateFolder) -> ObjectId:
    """Freeze ``folder``'s template as it is now; its id is what the ref records.

    Re-signing a changed template is allowed only once its cohorts' versions rose.
    """
    check_signoff(store, folder)
    rec = template_record(folder)
    rid = store.put(rec)
    ref = signoff_ref(folder.name)
    if store.refs.get(ref) != rid:
        cohorts = ", ".join(f"{k} {v}" for k, v in rec.cohorts.items())
        store.refs.update(ref, lambda _old: rid, message=f"signoff {folder.name} ({cohorts})")
    return rid
