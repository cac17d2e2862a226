"""A deterministic synthetic EHR: the data files of the example dataset ``synth-ehr``.

    python -m examples.synth --patients 200 --seed 0 --out examples/studio/datasets/synth-ehr/data

writes five Parquet tables (patients, encounters, vitals, labs, medications) and one array
family, the ECG: a zarr v3 group stored in a medomni store (``arrays/``, ref
``synth-ehr/ecg``; chunks are content-addressed blobs): ``signal``, one resting 12-lead ECG
per patient —
10 s at 500 Hz, in microvolts, shaped as MIMIC-IV-ECG's records are —, and ``patient_id``,
the patient of each row).

Same seed and patient count give the same bytes. Patient i's data does not depend on the
count either: patients are made in blocks of `BLOCK`, block b from its own generator
(``SeedSequence(seed, spawn_key=(b,))``), and a block is always drawn whole and then cut. So
the first 20 patients are the same whether 50 or 100,000 are written (cohort n20 is the first
patients of n50 only if that holds). Everything is vectorised per block.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr

import medomni_cas as mc
from medomni_cas.views.zarr_store import CASStore

__all__ = [
    "BLOCK",
    "ECG_HZ",
    "ECG_LEADS",
    "ECG_SAMPLES",
    "FIRST_ID",
    "TABLES",
    "generate",
    "main",
]

BLOCK = 1000
FIRST_ID = 10_000_000
ECG_HZ = 500
ECG_SAMPLES = 10 * ECG_HZ
ECG_LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
ECG_CHUNK = 100  # patients per zarr chunk (12 MB of int16)
ARRAYS = "arrays"  # the medomni store holding the array families, in the output folder
ECG_REF = "synth-ehr/ecg"
# how strongly each lead sees the heart's main axis (aVR looks at it from the other side)
_LEAD_GAIN = np.array([0.6, 1.0, 0.4, -0.8, 0.1, 0.7, -0.3, 0.2, 0.6, 1.1, 1.0, 0.8])
TABLES = ("patients", "encounters", "vitals", "labs", "medications")
DEFAULT_OUT = Path(__file__).parent / "studio" / "datasets" / "synth-ehr" / "data"

_DAY = 86_400
_TIME = pa.timestamp("ms")  # Parquet has no seconds unit: write what is read back
_EPOCH_DAY = 15_340  # 2012-01-01, in days since 1970-01-01
_STAGE_LOW = np.array([90.0, 60.0, 45.0, 30.0, 15.0, 5.0])  # G1 G2 G3a G3b G4 G5
_STAGE_HIGH = np.array([120.0, 90.0, 60.0, 45.0, 30.0, 15.0])
_KINDS = np.array(["outpatient", "inpatient", "emergency"])
_TESTS = ("eGFR", "creatinine", "HbA1c", "glucose", "potassium")
_UNITS = {
    "eGFR": "mL/min/1.73m2",
    "creatinine": "mg/dL",
    "HbA1c": "%",
    "glucose": "mg/dL",
    "potassium": "mmol/L",
}
_DRUGS = ("metformin", "insulin", "lisinopril", "atorvastatin", "furosemide")
_DOSES = np.array([1000.0, 20.0, 10.0, 40.0, 40.0])


@dataclass
class _Block:
    tables: dict[str, pa.Table]
    ecg: np.ndarray
    ids: np.ndarray


def _block(seed: int, b: int, keep: int) -> _Block:
    """Patients ``b*BLOCK .. b*BLOCK+keep-1``, drawn as a whole block and then cut."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(b,)))
    n = BLOCK
    ids = FIRST_ID + b * BLOCK + np.arange(n, dtype=np.int64)

    # Patient-level state; the order of draws is part of the output, never reorder.
    female = rng.random(n) < 0.5
    first_day = _EPOCH_DAY + rng.integers(0, 6 * 365, n)
    age = rng.integers(25, 90, n)
    stage = rng.integers(0, 6, n)
    egfr0 = rng.uniform(_STAGE_LOW[stage], _STAGE_HIGH[stage])
    diabetic = rng.random(n) < 0.35
    decline = rng.gamma(2.0, 0.8, n) * np.where(diabetic, 1.8, 1.0)  # mL/min per year
    a1c0 = np.where(diabetic, rng.normal(8.0, 1.2, n), rng.normal(5.4, 0.3, n))
    a1c_drift = rng.normal(0.0, 0.3, n)
    hr0 = rng.normal(72.0, 10.0, n)
    sbp0 = rng.normal(130.0, 15.0, n)
    statin = rng.random(n) < 0.3
    smoker = rng.random(n) < 0.2
    n_enc = np.minimum(2 + rng.poisson(6.0, n), 25)

    # Encounters: patient-major, in time order within a patient.
    pe = np.repeat(np.arange(n), n_enc)
    e = len(pe)
    starts = np.cumsum(n_enc) - n_enc
    gaps = np.ceil(rng.exponential(90.0, e)).astype(np.int64)
    gaps[starts] = 0
    cum = np.cumsum(gaps)
    day = first_day[pe] + cum - cum[starts][pe]
    enc_t = day * _DAY + rng.integers(8 * 3600, 18 * 3600, e)
    kind = _KINDS[rng.choice(3, e, p=[0.75, 0.15, 0.10])]
    years = (enc_t - first_day[pe] * _DAY) / (365.25 * _DAY)

    hr = np.round(hr0[pe] + rng.normal(0.0, 6.0, e)).astype(np.int64)
    sbp = np.round(sbp0[pe] + rng.normal(0.0, 8.0, e)).astype(np.int64)
    dbp = np.round(0.6 * sbp + rng.normal(0.0, 5.0, e)).astype(np.int64)
    temp = np.round(rng.normal(36.8, 0.3, e), 1)

    egfr_true = np.clip(egfr0[pe] - decline[pe] * years, 3.0, 130.0)
    a1c_true = np.clip(a1c0[pe] + a1c_drift[pe] * years, 4.0, 15.0)
    # panels: renal (eGFR with its creatinine), HbA1c, glucose, potassium
    p_panel = np.stack(
        [
            np.full(e, 0.6),
            np.where(diabetic[pe], 0.5, 0.25),
            np.full(e, 0.5),
            np.full(e, 0.4),
        ],
        axis=1,
    )
    drawn = rng.random((e, 4)) < p_panel
    lab_delay = rng.integers(1800, 4 * 3600, (e, 4))
    noise = rng.normal(0.0, 1.0, (e, 5))
    egfr = np.round(np.clip(egfr_true + 3.0 * noise[:, 0], 3.0, 130.0), 1)
    values = {
        "eGFR": egfr,
        "creatinine": np.round(0.9 * (egfr / 141.0) ** (-1 / 1.209) + 0.03 * noise[:, 1], 2),
        "HbA1c": np.round(np.clip(a1c_true + 0.2 * noise[:, 2], 4.0, 15.0), 1),
        "glucose": np.round(28.7 * a1c_true - 46.7 + 15.0 * noise[:, 3]),
        "potassium": np.round(4.2 + 0.6 * (egfr_true < 30) + 0.3 * noise[:, 4], 1),
    }
    panel_of = {"eGFR": 0, "creatinine": 0, "HbA1c": 1, "glucose": 2, "potassium": 3}

    # Medications: each indicated drug is prescribed at an encounter with probability 0.5.
    indicated = np.stack(
        [
            diabetic[pe] & (egfr_true >= 30),
            diabetic[pe] & (a1c0[pe] > 9.0),
            (egfr_true < 60) | (sbp0[pe] > 140),
            statin[pe],
            egfr_true < 30,
        ],
        axis=1,
    )
    prescribed = indicated & (rng.random((e, len(_DRUGS))) < 0.5)

    # ECG: 12 leads at the patient's resting rate; a taller T wave with poor kidney function.
    t = np.arange(ECG_SAMPLES) / ECG_HZ
    phase = (t[None, :] * (hr0[:, None] / 60.0) + rng.random(n)[:, None]) % 1.0
    t_amp = 250.0 + 250.0 * (egfr0 < 30)
    wave = (
        150.0 * np.exp(-(((phase - 0.15) / 0.03) ** 2))
        + 1000.0 * np.exp(-(((phase - 0.30) / 0.012) ** 2))
        + t_amp[:, None] * np.exp(-(((phase - 0.55) / 0.06) ** 2))
    ).astype(np.float32)
    # each lead's noise is a window of one shared noise bank at a random offset: as random
    # to the eye as fresh draws, at a fraction of their cost
    bank = rng.normal(0.0, 20.0, ECG_SAMPLES * 4).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(bank, ECG_SAMPLES)
    offsets = rng.integers(0, len(windows), (n, len(ECG_LEADS)))
    ecg = np.empty((n, len(ECG_LEADS), ECG_SAMPLES), dtype=np.int16)
    for i, gain in enumerate(_LEAD_GAIN):
        ecg[:, i, :] = np.round(gain * wave + windows[offsets[:, i]])

    # Cut to the patients asked for: every row of patient k < keep, nothing else.
    pk = np.arange(n) < keep
    ek = pe < keep
    ts = _TIME
    tables = {
        "patients": pa.table(
            {
                "patient_id": ids[pk],
                "sex": np.where(female, "F", "M")[pk],
                "birth_date": pa.array(
                    (first_day - np.round(age * 365.25).astype(np.int64))[pk].astype(np.int32),
                    pa.date32(),
                ),
                "smoker": smoker[pk],
            }
        ),
        "encounters": pa.table(
            {
                "patient_id": ids[pe][ek],
                "time": pa.array(enc_t[ek] * 1000, ts),
                "kind": kind[ek],
            }
        ),
        "vitals": pa.table(
            {
                "patient_id": ids[pe][ek],
                "time": pa.array(enc_t[ek] * 1000, ts),
                "heart_rate": hr[ek],
                "systolic_bp": sbp[ek],
                "diastolic_bp": dbp[ek],
                "temperature": temp[ek],
            }
        ),
        "labs": _labs(ids, pe, enc_t, drawn, lab_delay, values, panel_of, ek),
        "medications": _meds(ids, pe, enc_t, prescribed, ek),
    }
    return _Block(tables, ecg[pk], ids[pk])


def _labs(
    ids: np.ndarray,
    pe: np.ndarray,
    enc_t: np.ndarray,
    drawn: np.ndarray,
    delay: np.ndarray,
    values: dict[str, np.ndarray],
    panel_of: dict[str, int],
    keep: np.ndarray,
) -> pa.Table:
    enc, test, panel = [], [], []
    for i, name in enumerate(_TESTS):
        rows = np.flatnonzero(drawn[:, panel_of[name]] & keep)
        enc.append(rows)
        test.append(np.full(len(rows), i))
        panel.append(np.full(len(rows), panel_of[name]))
    rows, tests, panels = np.concatenate(enc), np.concatenate(test), np.concatenate(panel)
    time = enc_t[rows] + delay[rows, panels]
    order = np.lexsort((tests, time, pe[rows]))  # by patient, then time, then test
    rows, tests, time = rows[order], tests[order], time[order]
    names = np.array(_TESTS)[tests]
    value = np.empty(len(rows))
    for i, name in enumerate(_TESTS):
        sel = tests == i
        value[sel] = values[name][rows[sel]]
    return pa.table(
        {
            "patient_id": ids[pe[rows]],
            "time": pa.array(time * 1000, _TIME),
            "test": names,
            "value": value,
            "unit": np.array([_UNITS[t] for t in _TESTS])[tests],
        }
    )


def _meds(
    ids: np.ndarray, pe: np.ndarray, enc_t: np.ndarray, prescribed: np.ndarray, keep: np.ndarray
) -> pa.Table:
    enc, drug = np.nonzero(prescribed & keep[:, None])  # row-major: encounter order, then drug
    return pa.table(
        {
            "patient_id": ids[pe[enc]],
            "time": pa.array(enc_t[enc] * 1000, _TIME),
            "drug": np.array(_DRUGS)[drug],
            "dose_mg": _DOSES[drug],
        }
    )


def generate(out: str | Path, *, patients: int, seed: int = 0) -> Path:
    """Write the dataset's data files for ``patients`` patients into ``out``; return it."""
    if not 1 <= patients <= 10_000_000:
        raise ValueError(f"patients must be between 1 and 10,000,000, got {patients}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    # the ECG goes into a medomni store as a zarr hierarchy over the CAS: chunks are blobs,
    # and the ref ECG_REF names the tree of the whole family
    arrays = mc.open(f"lmdb://{(root / ARRAYS).resolve()}")
    cas = CASStore(arrays)
    group = zarr.open_group(store=cas, mode="w", zarr_format=3)
    group.attrs.update(
        {
            "leads": list(ECG_LEADS),
            "sampling_rate_hz": ECG_HZ,
            "units": "uV",
            "patient_key": "patient_id",
        }
    )
    signal = group.create_array(
        "signal",
        shape=(patients, len(ECG_LEADS), ECG_SAMPLES),
        chunks=(ECG_CHUNK, len(ECG_LEADS), ECG_SAMPLES),
        dtype="int16",
    )
    pid = group.create_array("patient_id", shape=(patients,), chunks=(BLOCK,), dtype="int64")
    parts: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
    for b in range((patients + BLOCK - 1) // BLOCK):
        keep = min(BLOCK, patients - b * BLOCK)
        block = _block(seed, b, keep)
        for name, table in block.tables.items():
            parts[name].append(table)
        signal[b * BLOCK : b * BLOCK + keep] = block.ecg
        pid[b * BLOCK : b * BLOCK + keep] = block.ids
    cas.commit()
    arrays.refs.update(ECG_REF, lambda _old: cas.root, message=f"{patients} patients, seed {seed}")
    arrays.close()
    for name, tables in parts.items():
        table = pa.concat_tables(tables).combine_chunks()
        pq.write_table(table, root / f"{name}.parquet", compression="zstd")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.synth", description=__doc__)
    parser.add_argument("--patients", type=int, default=200, help="50 to 100,000 (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    out = generate(args.out, patients=args.patients, seed=args.seed)
    print(f"wrote {args.patients} patients (seed {args.seed}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
