"""Audit of results: where a score came from, whether it is intact, how two scores differ.

Porcelain over the studio and bench records (it never touches a backend's internals):

* `provenance` — the tree from a `Result` down to templates, cohorts and their versions,
  build configs, dataset release, builder, agent config, served models, runs, predictions
  and answer keys, summarised (`medomni_cas.audit.provenance`);
* `verify_result` — re-hash every object of the result's closure, naming each missing or
  corrupt one and where it sits (`medomni_cas.audit.verify`), and compute its score again
  from its jobs, naming each row or link that is not what they give
  (`medomni_cas.audit.rederive`);
* `diff_results` — exactly which inputs of two results differ (`medomni_cas.audit.diff`);
* `to_prov_json` — the provenance as W3C PROV-JSON (`medomni_cas.audit.prov`).
"""

from medomni_cas.audit._common import AuditError
from medomni_cas.audit.diff import Difference, diff_results
from medomni_cas.audit.prov import to_prov_json
from medomni_cas.audit.provenance import Provenance, provenance
from medomni_cas.audit.rederive import ScoreProblem
from medomni_cas.audit.verify import VerifyProblem, VerifyReport, verify_result

__all__ = [
    "AuditError",
    "Difference",
    "Provenance",
    "ScoreProblem",
    "VerifyProblem",
    "VerifyReport",
    "diff_results",
    "provenance",
    "to_prov_json",
    "verify_result",
]
