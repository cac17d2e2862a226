"""The synthetic EHR generator: deterministic bytes, patients independent of the count, zarr."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import zarr

import medomni_cas as mc
from examples import synth
from medomni_cas.studio import folders
from medomni_cas.views.zarr_store import CASStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def files(root: Path) -> dict[str, bytes]:
    """Every Parquet file's bytes, and the ECG family's tree id (LMDB's own file is not
    byte-stable; the content-addressed tree of every chunk and metadata file is)."""
    out = {p.name: p.read_bytes() for p in sorted(root.glob("*.parquet"))}
    with mc.open(f"lmdb://{root / synth.ARRAYS}", create=False) as store:
        out["ecg"] = bytes(store.refs[synth.ECG_REF])
    return out


_OPEN: dict[Path, mc.Store] = {}  # LMDB opens an environment once per process


def ecg(root: Path) -> zarr.Group:
    if root not in _OPEN:
        _OPEN[root] = mc.open(f"lmdb://{root / synth.ARRAYS}", create=False)
    return zarr.open_group(store=CASStore(_OPEN[root], synth.ECG_REF, read_only=True), mode="r")


@pytest.fixture(scope="module")
def n50(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth.generate(tmp_path_factory.mktemp("n50"), patients=50, seed=7)


def test_same_seed_same_bytes(n50: Path, tmp_path: Path) -> None:
    again = files(synth.generate(tmp_path / "again", patients=50, seed=7))
    first = files(n50)
    assert {f"{t}.parquet" for t in synth.TABLES} <= set(first)
    assert len(first["ecg"]) == 32
    assert again == first  # every Parquet file, and the tree of every zarr chunk


def test_another_seed_other_data(n50: Path, tmp_path: Path) -> None:
    other = synth.generate(tmp_path / "other", patients=50, seed=8)
    assert (other / "labs.parquet").read_bytes() != (n50 / "labs.parquet").read_bytes()


def test_first_patients_do_not_depend_on_the_count(n50: Path, tmp_path: Path) -> None:
    # 1,200 spans two generator blocks: the first block must not notice the second.
    big = synth.generate(tmp_path / "big", patients=1200, seed=7)
    first20 = synth.FIRST_ID + 20
    for name in synth.TABLES:
        a, b = pq.read_table(n50 / f"{name}.parquet"), pq.read_table(big / f"{name}.parquet")
        assert a.schema == b.schema
        a20 = a.filter(pc.less(a["patient_id"], first20))
        b20 = b.filter(pc.less(b["patient_id"], first20))
        assert a20.num_rows > 0 and a20.equals(b20), name
        assert a.equals(b.slice(0, a.num_rows)), name  # all 50, in the same row order
    za, zb = ecg(n50), ecg(big)
    np.testing.assert_array_equal(za["signal"][:50], zb["signal"][:50])
    assert pq.read_table(big / "patients.parquet").num_rows == 1200


def test_tables_have_what_the_labels_need(n50: Path) -> None:
    patients = pq.read_table(n50 / "patients.parquet")
    assert patients["patient_id"].to_pylist() == list(range(synth.FIRST_ID, synth.FIRST_ID + 50))
    labs = pq.read_table(n50 / "labs.parquet")
    assert set(labs["test"].to_pylist()) == {"eGFR", "creatinine", "HbA1c", "glucose", "potassium"}
    assert (
        labs.schema.field("time").type
        == pq.read_table(n50 / "encounters.parquet").schema.field("time").type
    )
    patients_with_labs = set(labs["patient_id"].to_pylist())
    assert patients_with_labs <= set(patients["patient_id"].to_pylist())


def test_ecg_is_a_zarr_v3_array_family(n50: Path) -> None:
    group = ecg(n50)
    assert group.metadata.zarr_format == 3
    signal, ids = group["signal"], group["patient_id"]
    assert signal.shape == (50, 12, synth.ECG_SAMPLES) and signal.dtype == np.int16
    assert group.attrs["sampling_rate_hz"] == synth.ECG_HZ
    assert group.attrs["leads"] == list(synth.ECG_LEADS)
    patients = pq.read_table(n50 / "patients.parquet")["patient_id"].to_numpy()
    np.testing.assert_array_equal(ids[:], patients)
    leads = group["signal"][3]
    ii, avr = leads[synth.ECG_LEADS.index("II")], leads[synth.ECG_LEADS.index("aVR")]
    assert ii.max() > 500 and avr.min() < -400  # an R wave upright in II, inverted in aVR
    assert not np.array_equal(leads[0], leads[6])


def test_writes_every_file_the_example_dataset_names(tmp_path: Path) -> None:
    ds = folders.load_dataset(EXAMPLES / "studio/datasets/synth-ehr")
    assert synth.main(["--patients", "50", "--seed", "1", "--out", str(tmp_path / "data")]) == 0
    for table in ds.tables:
        assert (tmp_path / table.file).is_file(), table.file
        assert ds.patient_key in pq.read_schema(tmp_path / table.file).names
        if table.time_column is not None:
            assert table.time_column in pq.read_schema(tmp_path / table.file).names
    for array in ds.arrays:
        with mc.open(f"lmdb://{tmp_path / array.store}", create=False) as store:
            assert store.refs.get(array.ref) is not None


def test_refuses_a_bad_count(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="patients must be"):
        synth.generate(tmp_path, patients=0)
