"""The Arrow schemas of Bench's tables, each defined once.

Stored
    `PREDICTION_SCHEMA` types a job's prediction columns (`bench.columns`) and `SCORE_SCHEMA`
    a result's Parquet blob (`bench.scorer`). Both decide the bytes of stored blobs, and so
    object ids: a type here never changes.

Shown
    The notebook's tables (`medomni_cas.notebook`): one row per task set, atom task, run,
    prediction or score row. They are views, never stored, so their types are the ones a
    reader wants: integers, timestamps, lists and maps rather than text.
"""

from __future__ import annotations

import pyarrow as pa

from medomni_cas.bench.records import ScoreRow

__all__ = [
    "ATOM_SCHEMA",
    "JOB_COLUMNS",
    "PREDICTION_COLUMNS",
    "PREDICTION_SCHEMA",
    "PREDICTION_TABLE_SCHEMA",
    "RESULT_COLUMNS",
    "RESULT_TABLE_SCHEMA",
    "RUN_SCHEMA",
    "SCORES_TYPE",
    "SCORE_SCHEMA",
    "TASK_SET_SCHEMA",
    "TIME_TYPE",
]

_S = pa.string()

# -- stored ---------------------------------------------------------------------------------------
#: A job's predictions as `read_predictions` returns them, in this order.
PREDICTION_COLUMNS = (
    "run_id",
    "slot",
    "atom",
    "target",
    "value_text",
    "value_num",
    "intelligence",
    "agent",
    "arm",
    "arm_variant",
    "repetition",
    "pair",
    "config",
    "outcome",
    "attempt",
    "scores",  # JSON {class: probability}, when the agent gave them
)
_PREDICTION_TYPES = {"value_num": pa.float64(), "repetition": pa.int32(), "attempt": pa.int32()}
PREDICTION_SCHEMA = pa.schema([(c, _PREDICTION_TYPES.get(c, _S)) for c in PREDICTION_COLUMNS])

_SCORE_TYPES = {
    "value": pa.float64(),
    "ci_low": pa.float64(),
    "ci_high": pa.float64(),
    "n": pa.int64(),
    "n_missing": pa.int64(),
    "attempts": pa.int64(),
    "expected": pa.int64(),
    "answered": pa.int64(),
    "unanswered": pa.map_(_S, pa.int64()),  # outcome -> slots
    "never_run": pa.int64(),
    "partial": pa.bool_(),
}
#: A result's rows (`ScoreRow`, field for field), as its Parquet blob holds them.
SCORE_SCHEMA = pa.schema([(f, _SCORE_TYPES.get(f, _S)) for f in ScoreRow.__struct_fields__])

# -- shown ----------------------------------------------------------------------------------------
#: Run times: the records hold ISO-8601 text in UTC to the millisecond.
TIME_TYPE = pa.timestamp("ms", tz="UTC")
#: A prediction's class probabilities, stored as JSON text, shown as a map.
SCORES_TYPE = pa.map_(_S, pa.float64())

TASK_SET_SCHEMA = pa.schema(
    [
        ("name", _S),
        ("task_set", _S),
        ("builder", _S),
        ("arms", pa.list_(_S)),
        ("pairs", pa.list_(_S)),  # "<template>@<cohort> (N=n)"
        ("build", _S),  # the latest SetBuild of this set, if any
        ("entries", pa.int32()),  # pairs x arms (and rungs) built
        ("built", pa.bool_()),
    ]
)
ATOM_SCHEMA = pa.schema(
    [
        ("pair", _S),
        ("version", _S),
        ("arm", _S),
        ("arm_variant", _S),
        ("patient", _S),
        ("atom", _S),
        ("config", _S),
        # the cohort's time, as the dataset wrote it (no zone; UTC when it had one)
        ("prediction_time", pa.timestamp("us")),
        ("families", pa.list_(_S)),
        ("build", _S),  # the pair's BuildResult
    ]
)
RUN_SCHEMA = pa.schema(
    [
        ("set", _S),
        ("task_set", _S),
        ("job", _S),  # the run folder's name
        ("job_id", _S),
        ("agent", _S),
        ("agent_config", _S),
        ("arm", _S),
        ("arm_variant", _S),
        ("repetition", pa.int32()),
        ("pair", _S),
        ("task_version", _S),
        ("config", _S),
        ("atom", _S),
        ("run_id", _S),
        ("record", _S),  # the RunRecord's id
        ("outcome", _S),
        ("attempt", pa.int32()),
        ("runner", _S),
        ("environment", _S),
        ("isolation", _S),
        ("served_model", _S),
        ("started", TIME_TYPE),
        ("finished", TIME_TYPE),
        ("elapsed_ms", pa.int64()),
        ("cost_usd", pa.float64()),
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("encoder_calls", pa.int32()),
        ("meets_arm", pa.bool_()),
        ("errors", pa.list_(_S)),
    ]
)
#: What `predictions` and `results` put in front of each job's or result's rows.
JOB_COLUMNS: list[tuple[str, pa.DataType]] = [("set", _S), ("job", _S), ("job_id", _S)]
RESULT_COLUMNS: list[tuple[str, pa.DataType]] = [("set", _S), ("result", _S), ("task_set", _S)]

PREDICTION_TABLE_SCHEMA = pa.schema(
    JOB_COLUMNS
    + [(f.name, SCORES_TYPE if f.name == "scores" else f.type) for f in PREDICTION_SCHEMA]
)
RESULT_TABLE_SCHEMA = pa.schema(
    RESULT_COLUMNS + [f for f in SCORE_SCHEMA if f.name != "task_set"]  # the result's, in front
)
