"""The refs Studio writes: every name under its namespace is made here.

Namespace
---------
Each prefix, what its refs point at, and who moves them::

    tasksets/<benchmark>/<set>       the set's `TaskSetRecord`; an update    tasksets
                                     that does not only grow is refused,
                                     on every path (`refpolicy`)
    studio/sets/<benchmark>/<set>    the set's latest `SetBuild` (it moves   tasksets
                                     with X rises)
    studio/pairs/<pair>/<arm label>  the pair's last `BuildResult` under     build
                                     the arm: the next build's config is
                                     checked against its config
    studio/builds/<config hex>/<data digest>
                                     the `BuildResult` of a config on some   build
                                     data: the rebuild cache, create-only
    studio/signoff/<template>        the signed-off `TemplateRecord`         signoff
    published/<benchmark>/<set>      a `PublishedSet`, in a bundle           tasksets.publish
    studio/commitments/<benchmark>/<set>
                                     the set's `AnswerCommitment`: the root  commitments.commit
                                     of its salted answers, publishable
    studio/answer-salts/<benchmark>/<set>
                                     its `AnswerSalts`: secret, kept with    commitments.commit
                                     the answer keys, never published

Names on disk are forever: a store written before keeps its refs.

Bench's namespace is `medomni_cas.bench.refnames`.
"""

from __future__ import annotations

from medomni_cas.store.ids import ObjectId
from medomni_cas.studio.arms import arm_label

__all__ = [
    "ANSWER_SALT_REFS",
    "COMMITMENT_REFS",
    "BUILD_CACHE_REFS",
    "PAIR_REFS",
    "PUBLISHED_REFS",
    "SET_BUILD_REFS",
    "SIGNOFF_REFS",
    "TASK_SET_REFS",
    "answer_salts_ref",
    "build_cache_ref",
    "commitment_ref",
    "pair_ref",
    "published_ref",
    "set_build_ref",
    "signoff_ref",
    "task_set_ref",
]

TASK_SET_REFS = "tasksets/"
SET_BUILD_REFS = "studio/sets/"
PAIR_REFS = "studio/pairs/"
BUILD_CACHE_REFS = "studio/builds/"
SIGNOFF_REFS = "studio/signoff/"
PUBLISHED_REFS = "published/"
COMMITMENT_REFS = "studio/commitments/"
ANSWER_SALT_REFS = "studio/answer-salts/"


def task_set_ref(name: str) -> str:
    return f"{TASK_SET_REFS}{name}"


def set_build_ref(name: str) -> str:
    return f"{SET_BUILD_REFS}{name}"


def pair_ref(pair: str, arm: str, variant: str = "") -> str:
    return f"{PAIR_REFS}{pair}/{arm_label(arm, variant)}"


def build_cache_ref(config: ObjectId, data_digest: str) -> str:
    return f"{BUILD_CACHE_REFS}{config.hex()}/{data_digest}"


def signoff_ref(template: str) -> str:
    return f"{SIGNOFF_REFS}{template}"


def published_ref(name: str) -> str:
    return f"{PUBLISHED_REFS}{name}"


def commitment_ref(name: str) -> str:
    return f"{COMMITMENT_REFS}{name}"


def answer_salts_ref(name: str) -> str:
    return f"{ANSWER_SALT_REFS}{name}"
