"""The deterministic baseline agent: reads the staged files and answers with no model.

Run by the process runner as ``python -m medomni_cas.bench.baseline`` (the example's
``bench/agents/baseline.yaml``). It ships with the library rather than in ``examples/`` so
that it runs from any install: an agent config's command is part of its id (run slots hash
it), so it cannot name a file by a path that differs from one machine or folder to the next,
and the agent runs in a scratch folder where ``examples`` is not importable.

It reads what every agent gets (``answer_schema.json`` and the evidence files in its working
folder) and writes one prediction per target to ``$MEDOMNI_SUBMISSION``. Its rules are
simple on purpose, so that scores measure the harness, not the agent:

* a numeric target: the last value of the lab it names (HbA1c for ``hba1c_next``), else the
  median of that lab in the record, else 6.0;
* ``ckd_stage``: from what survives the guards (furosemide, metformin, potassium, age),
  and, when the perception service is there, from the ECG's T wave (the ``ecg-summary``
  encoder): a tall T wave suggests G4/G5;
* any other class target: its first class.

An agent of your own is any command (``settings.command``); see `medomni_cas.bench.process`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _encoder(name: str) -> dict[str, Any] | None:
    url = os.environ.get("MEDOMNI_PERCEPTION_URL")
    if not url:
        return None
    try:
        with urllib.request.urlopen(f"{url}/v1/encoders", timeout=10) as r:
            served = {e["name"] for e in json.load(r)}
        if name not in served:
            return None
        req = urllib.request.Request(
            f"{url}/v1/encode",
            data=json.dumps({"encoder": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r).get("features")
    except OSError:
        return None


def _ckd(work: Path, classes: list[str], ecg: dict[str, Any] | None) -> str:
    meds = {m.get("drug") for m in _jsonl(work / "medications.jsonl")}
    labs = _jsonl(work / "labs.jsonl")
    potassium = [
        row["value"] for row in labs if row.get("test") == "potassium" and row.get("value")
    ]
    score = 0.0
    if "furosemide" in meds:
        score += 2.0
    if "metformin" in meds:
        score -= 1.0
    if potassium and statistics.mean(potassium) > 4.8:
        score += 1.0
    if ecg:
        t_wave = ecg.get("t_wave_amplitude_uv") or ecg.get("t_amplitude_uv")
        if isinstance(t_wave, int | float) and t_wave > 380:
            score += 2.5
    order = ["G1", "G2", "G3a", "G3b", "G4", "G5"]
    pick = order[max(0, min(5, round(1.5 + score)))]
    return pick if pick in classes else classes[0]


def _numeric(work: Path, target: str) -> float:
    lab = "HbA1c" if "hba1c" in target.lower() else None
    values = [
        row["value"]
        for row in _jsonl(work / "labs.jsonl")
        if lab is not None and row.get("test") == lab and row.get("value") is not None
    ]
    if values:
        return round(float(values[-1]), 2)
    return 6.0


def main() -> int:
    work = Path(os.environ.get("MEDOMNI_WORKSPACE", "."))
    out = Path(os.environ.get("MEDOMNI_SUBMISSION", work / "answer.json"))
    schema = json.loads((work / "answer_schema.json").read_text())
    # on arms with the perception service, look at the ECG once, whatever the targets
    ecg = _encoder("ecg-summary")
    answer: dict[str, Any] = {}
    for t in schema["targets"]:
        if t["kind"] == "numeric":
            answer[t["name"]] = _numeric(work, t["name"])
        elif t["name"] == "ckd_stage":
            answer[t["name"]] = _ckd(work, t["classes"], ecg)
        else:
            answer[t["name"]] = t["classes"][0]
    out.write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
