"""The perception gateway: family filter, budget, call log, encoders, serving and the sidecar."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr

import medomni_cas as mc
from examples import synth
from medomni_cas.bench import encoders as enc_mod
from medomni_cas.bench.encoders import (
    BaseEncoder,
    EcgSummary,
    EncoderRegistryError,
    TableSummary,
    canonical_json,
    encoders,
    reset_registry,
)
from medomni_cas.bench.perception import (
    EncoderCall,
    Gateway,
    meets_arm,
    read_call_log,
    serve,
)
from medomni_cas.views.zarr_store import CASStore

with warnings.catch_warnings():
    # starlette 1.x would rather have httpx2; the httpx it falls back to works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parents[1]
ALL = ("demographics", "encounters", "vitals", "labs", "medications", "ecg")
TABLE_FILES = {
    "patients": "patients.jsonl",
    "encounters": "encounters.jsonl",
    "vitals": "vitals.jsonl",
    "labs": "labs.jsonl",
    "medications": "medications.jsonl",
}


# -- evidence like Build stages it --------------------------------------------------------------
class Synth:
    """The synthetic dataset in memory: per patient, its evidence files as Build writes them."""

    def __init__(self, root: Path) -> None:
        with mc.open(f"lmdb://{root / synth.ARRAYS}", create=False) as store:
            cas = CASStore(store, synth.ECG_REF, read_only=True)
            group = zarr.open_group(store=cas, mode="r")
            self.ids = [int(x) for x in np.asarray(group["patient_id"][:])]
            self.signal = np.asarray(group["signal"][:])
            self.attrs = canonical_json(dict(group.attrs)) + b"\n"
        self.tables = {t: pq.read_table(root / f"{t}.parquet").to_pylist() for t in synth.TABLES}

    def files(self, i: int) -> dict[str, bytes]:
        pid = self.ids[i]
        out: dict[str, bytes] = {}
        for table, fname in TABLE_FILES.items():
            rows = [r for r in self.tables[table] if r["patient_id"] == pid]
            out[fname] = b"".join(canonical_json(_jsonable(r)) + b"\n" for r in rows)
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(self.signal[i]), version=(1, 0))
        out["ecg.signal.npy"] = buf.getvalue()
        out["ecg.attrs.json"] = self.attrs
        return out


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, dt.date) else v for k, v in row.items()}


def write(folder: Path, files: Mapping[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return Synth(synth.generate(tmp_path_factory.mktemp("synth"), patients=50, seed=0))


@pytest.fixture
def evidence(data: Synth, tmp_path: Path) -> Path:
    return write(tmp_path / "evidence", data.files(0))


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    reset_registry()
    yield
    reset_registry()


def post(client: TestClient, body: Any) -> Any:
    return client.post("/v1/encode", json=body)


# -- listing and the family filter --------------------------------------------------------------
def test_lists_every_staged_family_with_its_encoder(evidence: Path) -> None:
    gw = Gateway(evidence, ALL, budget=5, atom="a1")
    client = TestClient(gw.app)
    assert client.get("/health").json() == {"ok": True}
    r = client.get("/v1/encoders")
    assert r.headers["x-budget"] == r.headers["x-calls-left"] == "5"
    listed = r.json()
    by_name = {e["name"]: e for e in listed}
    assert by_name["ecg-summary"]["families"] == ["ecg"]
    assert by_name["table-summary"]["families"] == [
        "demographics",
        "encounters",
        "vitals",
        "labs",
        "medications",
    ]
    for e in listed:
        assert e["digest"] == encoders()[e["name"]].digest and len(e["digest"]) == 64
        assert e["version"] and e["description"]
    assert client.get("/").json()["families"] == list(ALL)


def test_family_filter_hides_and_refuses_families_not_staged(data: Synth, tmp_path: Path) -> None:
    # The folder holds every family's files (as a mis-staged task might); only demographics is
    # staged, so nothing of ecg or vitals is listed or served.
    gw = Gateway(write(tmp_path / "ev", data.files(0)), ["demographics"], budget=5, atom="a1")
    client = TestClient(gw.app)
    listed = client.get("/v1/encoders").json()
    assert [(e["name"], e["families"]) for e in listed] == [("table-summary", ["demographics"])]
    r = post(client, {"encoder": "ecg-summary"})
    assert r.status_code == 404 and "ecg-summary" in r.json()["error"]
    r = post(client, {"encoder": "table-summary", "family": "vitals"})
    assert r.status_code == 404 and "'vitals' is not staged" in r.json()["error"]
    assert post(client, {"encoder": "table-summary"}).status_code == 200  # its one family
    assert [(c.status, c.http_status, c.encoder, c.family) for c in gw.calls] == [
        ("refused", 404, "ecg-summary", ""),
        ("refused", 404, "table-summary", "vitals"),
        ("ok", 200, "table-summary", "demographics"),
    ]
    assert gw.calls[0].encoder_digest == ""  # not served: no digest to claim
    assert gw.encoders_served() == [
        {"name": "table-summary", "version": "1.0.0", "digest": TableSummary().digest}
    ]


def test_staged_family_without_its_files_is_not_served(data: Synth, tmp_path: Path) -> None:
    files = {n: b for n, b in data.files(0).items() if not n.startswith("ecg.")}
    folder = write(tmp_path / "ev", files)
    gw = Gateway(folder, ALL, budget=5)
    # files written after the gateway starts (the agent's workspace) are never served
    write(folder, {n: b for n, b in data.files(0).items() if n.startswith("ecg.")})
    client = TestClient(gw.app)
    assert "ecg-summary" not in {e["name"] for e in client.get("/v1/encoders").json()}
    assert post(client, {"encoder": "ecg-summary"}).status_code == 404


def test_family_of_mapping_decides_a_files_family(data: Synth, tmp_path: Path) -> None:
    folder = write(tmp_path / "ev", data.files(0))
    family_of = {"ecg.signal.npy": "ecg", "ecg.attrs.json": "ecg", "patients.jsonl": "other"}
    gw = Gateway(folder, ALL, budget=5, family_of=family_of)
    assert [(e["name"], e["families"]) for e in gw.listing()] == [("ecg-summary", ["ecg"])]


def test_bad_requests_are_refused_and_logged(evidence: Path) -> None:
    gw = Gateway(evidence, ALL, budget=5, atom="a1")
    client = TestClient(gw.app)
    bad = [
        client.post("/v1/encode", content=b"{not json"),
        client.post("/v1/encode", content=b"[1, 2]"),
        post(client, {"encoder": "table-summary"}),  # five families: which one?
        post(client, {"encoder": "ecg-summary", "params": [1]}),
        post(client, {"encoder": "ecg-summary", "path": "../../etc/passwd"}),
        post(client, {}),
        client.post("/v1/encode", content=b" " * (65 * 1024)),
    ]
    assert [r.status_code for r in bad] == [400, 400, 400, 400, 400, 400, 413]
    assert "name a family" in bad[2].json()["error"]
    assert all(c.status == "refused" for c in gw.calls) and len(gw.calls) == len(bad)
    assert gw.calls_left == 5  # refusals spend nothing
    assert client.get("/v1/encode").status_code == 405


# -- budget -------------------------------------------------------------------------------------
def test_budget_refuses_the_call_past_it(evidence: Path) -> None:
    gw = Gateway(evidence, ALL, budget=2, atom="a1")
    client = TestClient(gw.app)
    first = post(client, {"encoder": "ecg-summary"})
    assert first.status_code == 200 and first.json()["calls_left"] == 1
    assert post(client, {"encoder": "table-summary", "family": "labs"}).json()["calls_left"] == 0
    third = post(client, {"encoder": "ecg-summary"})
    assert third.status_code == 429
    assert "budget" in third.json()["error"] and third.json()["calls_left"] == 0
    assert [c.status for c in gw.calls] == ["ok", "ok", "refused"]
    last = gw.calls[-1]
    assert (last.http_status, last.encoder, last.family) == (429, "ecg-summary", "ecg")
    assert last.encoder_digest == EcgSummary().digest and last.output_digest == ""
    assert client.get("/v1/encoders").headers["x-calls-left"] == "0"


def test_zero_budget_lists_but_serves_nothing(evidence: Path) -> None:
    client = TestClient(Gateway(evidence, ALL, budget=0).app)
    assert client.get("/v1/encoders").json()
    assert post(client, {"encoder": "ecg-summary"}).status_code == 429


# -- the call log -------------------------------------------------------------------------------
def test_call_log_fields_and_jsonl_file(evidence: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    gw = Gateway(evidence, ALL, budget=3, atom="ab" * 32, log_path=log)
    client = TestClient(gw.app)
    r = post(client, {"encoder": "ecg-summary", "family": "ecg", "params": {}})
    assert r.status_code == 200
    body = r.json()
    assert (body["encoder"], body["family"], body["version"]) == ("ecg-summary", "ecg", "1.0.0")
    post(client, {"encoder": "nope"})
    calls = gw.calls
    assert read_call_log(log) == calls
    assert [json.loads(line)["seq"] for line in log.read_text().splitlines()] == [1, 2]
    ok, refused = calls
    assert ok.atom == "ab" * 32 and ok.seq == 1 and ok.status == "ok" and ok.http_status == 200
    assert ok.encoder_version == "1.0.0" and ok.encoder_digest == EcgSummary().digest
    assert ok.inputs == ("ecg.attrs.json", "ecg.signal.npy")
    raw = b"".join((evidence / n).read_bytes() for n in ok.inputs)
    assert ok.input_digest == blake3.blake3(raw).hexdigest()
    assert ok.output_digest == blake3.blake3(canonical_json(body["features"])).hexdigest()
    assert dt.datetime.fromisoformat(ok.started).utcoffset() == dt.timedelta(0)
    assert ok.elapsed_ms > 0 and ok.detail == ""
    assert (refused.seq, refused.status, refused.encoder, refused.input_digest) == (
        2,
        "refused",
        "nope",
        "",
    )
    assert "nope" in refused.detail


def test_encoders_served_digests_are_stable(evidence: Path) -> None:
    a = Gateway(evidence, ALL, budget=1).encoders_served()
    b = Gateway(evidence, ALL, budget=9, atom="other").encoders_served()
    assert a == b and {e["name"] for e in a} == {"ecg-summary", "table-summary"}
    # pinned: the digest hashes name, version and parameters only, the same on every machine
    assert EcgSummary().digest == ECG_SUMMARY_DIGEST
    assert EcgSummary(rhythm_lead="V5").digest != EcgSummary().digest


# BLAKE3 of {"kind", "name", "version", "params"} in canonical JSON: changes only with those
ECG_SUMMARY_DIGEST = "f3367db8bd446b33d04da2c98f76190c7da799d5720535887f2bee9be1ab217e"
NOT_AN_ENCODER = "a plain string"


# -- ecg-summary --------------------------------------------------------------------------------
def test_ecg_summary_on_synthetic_patients(data: Synth) -> None:
    enc = EcgSummary()
    rates, vitals_rates, t_waves, low_egfr = [], [], [], []
    for i, pid in enumerate(data.ids):
        files = {n: b for n, b in data.files(i).items() if n.startswith("ecg.")}
        f = enc.encode(files, {})
        assert f["quality"] == "ok" and f["notes"] == []
        assert 40 < f["heart_rate_bpm"] < 130
        assert f["rr_std_ms"] < 20  # the generator's rhythm is regular
        assert f["beats"] >= 5 and f["duration_s"] == 10.0
        assert set(f["per_lead"]) == set(synth.ECG_LEADS)
        assert 10 < f["noise_std_uv"] < 30  # the generator adds N(0, 20 uV)
        rates.append(f["heart_rate_bpm"])
        vitals = [r["heart_rate"] for r in data.tables["vitals"] if r["patient_id"] == pid]
        vitals_rates.append(sum(vitals) / len(vitals))
        t_waves.append(f["t_wave_amplitude_uv"])
        egfr = [
            r["value"]
            for r in data.tables["labs"]
            if r["patient_id"] == pid and r["test"] == "eGFR"
        ]
        low_egfr.append(bool(egfr) and egfr[0] < 25)
    # each patient's resting rate drives both the ECG and the vitals' heart rate
    assert np.corrcoef(rates, vitals_rates)[0, 1] > 0.9
    # a taller T wave with poor kidney function (the generator doubles it under eGFR 30)
    tall = np.array(t_waves) > 400
    assert all(tall[np.array(low_egfr)])
    # deterministic: the same bytes give the same features
    files = {n: b for n, b in data.files(3).items() if n.startswith("ecg.")}
    assert canonical_json(enc.encode(files, {})) == canonical_json(EcgSummary().encode(files, {}))


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def test_garbage_signals_never_crash_the_gateway(data: Synth, tmp_path: Path) -> None:
    good = data.files(0)
    rng = np.random.default_rng(0)
    cases: dict[str, bytes] = {
        "zeros": _npy(np.zeros((12, 5000), np.int16)),
        "noise": _npy(rng.normal(0, 50, (12, 5000)).astype(np.int16)),
        "short": _npy(data.signal[0][:, :400]),
        "nan": _npy(np.full((12, 5000), np.nan)),
        "1-d": _npy(np.zeros(5000, np.int16)),
        "transposed": _npy(data.signal[0].T.copy()),
        "truncated": good["ecg.signal.npy"][:1000],
        "not npy": b"hello",
        "pickle": _npy(np.array([{"a": 1}], dtype=object)),
        "empty": b"",
    }
    answers = {}
    for name, raw in cases.items():
        folder = write(tmp_path / name.replace(" ", "_"), {**good, "ecg.signal.npy": raw})
        gw = Gateway(folder, ["ecg"], budget=1, atom=name)
        r = post(TestClient(gw.app), {"encoder": "ecg-summary"})
        (call,) = gw.calls
        assert r.status_code in (200, 422), (name, r.text)
        assert call.status == ("ok" if r.status_code == 200 else "error"), name
        answers[name] = (r.status_code, r.json())
    for name in ("zeros", "nan"):
        code, body = answers[name]
        assert code == 200 and body["features"]["quality"] == "flat"
        assert body["features"]["heart_rate_bpm"] is None and body["features"]["notes"]
    code, body = answers["noise"]
    assert code == 200 and body["features"]["heart_rate_bpm"] is None
    assert body["features"]["quality"] in ("noisy", "no beats", "implausible rhythm")
    assert answers["short"][1]["features"]["quality"] == "too short"
    for name in ("1-d", "transposed", "truncated", "not npy", "pickle", "empty"):
        code, body = answers[name]
        assert code == 422 and body["error"].startswith("ecg-summary: "), name


def test_bad_attrs_and_params(data: Synth, tmp_path: Path) -> None:
    good = data.files(0)
    gw = Gateway(write(tmp_path / "a", {**good, "ecg.attrs.json": b"[]"}), ["ecg"], budget=5)
    assert post(TestClient(gw.app), {"encoder": "ecg-summary"}).status_code == 422
    gw = Gateway(write(tmp_path / "b", good), ["ecg"], budget=5)
    client = TestClient(gw.app)
    r = post(client, {"encoder": "ecg-summary", "params": {"bogus": 1}})
    assert r.status_code == 422 and "bogus" in r.json()["error"]
    r = post(client, {"encoder": "ecg-summary", "params": {"rhythm_lead": "V5"}})
    assert r.status_code == 200 and r.json()["features"]["rhythm_lead"] == "V5"
    assert [c.status for c in gw.calls] == ["error", "ok"]  # an encoder error spends a call
    no_attrs = {n: b for n, b in good.items() if n != "ecg.attrs.json"}
    f = EcgSummary().encode(no_attrs, {})
    assert f["heart_rate_bpm"] is not None and "assumed 500 Hz" in f["notes"][0]


# -- table-summary ------------------------------------------------------------------------------
def test_table_summary_of_labs_by_test(evidence: Path, data: Synth) -> None:
    client = TestClient(Gateway(evidence, ALL, budget=3).app)
    r = post(client, {"encoder": "table-summary", "family": "labs", "params": {"by": "test"}})
    f = r.json()["features"]
    labs = [x for x in data.tables["labs"] if x["patient_id"] == data.ids[0]]
    assert f["rows"] == len(labs) and f["file"] == "labs.jsonl"
    egfr = [x["value"] for x in labs if x["test"] == "eGFR"]
    assert f["groups"]["eGFR"]["rows"] == len(egfr)
    assert f["groups"]["eGFR"]["columns"]["value"]["mean"] == pytest.approx(np.mean(egfr))
    assert f["first_time"] <= f["last_time"]
    demo = post(client, {"encoder": "table-summary", "family": "demographics"}).json()
    assert demo["features"]["rows"] == 1 and "sex" in demo["features"]["columns"]
    r = post(client, {"encoder": "table-summary", "family": "labs", "params": {"by": "nope"}})
    assert r.status_code == 422


# -- meets the arm ------------------------------------------------------------------------------
def _call(status: str) -> EncoderCall:
    return EncoderCall(
        atom="a",
        seq=1,
        encoder="ecg-summary",
        encoder_version="1.0.0",
        encoder_digest="d",
        family="ecg",
        status=status,  # type: ignore[arg-type]
        http_status=200 if status == "ok" else 429,
        started="2026-01-01T00:00:00.000+00:00",
        elapsed_ms=1.0,
        input_digest="",
        output_digest="",
        detail="",
    )


def test_meets_arm() -> None:
    ok, refused, error = _call("ok"), _call("refused"), _call("error")
    assert meets_arm("required", [refused, ok])[0]
    met, why = meets_arm("required", [])
    assert not met and "no successful encoder call" in why
    met, why = meets_arm("required", [refused, error])
    assert not met and "1 refused, 1 failed" in why
    assert meets_arm("allowed", []) == (True, "")
    assert meets_arm("allowed", [error])[0]
    assert meets_arm("none", []) == (True, "")
    met, why = meets_arm("none", [ok])
    assert not met and "no perception service" in why
    with pytest.raises(ValueError, match="bogus"):
        meets_arm("bogus", [])


# -- plug-ins -----------------------------------------------------------------------------------
class EchoEncoder(BaseEncoder):
    """A plug-in encoder for the tests: the sizes of its input files."""

    name = "echo"
    version = "0.1"
    families = ("vitals",)
    description = "sizes of the vitals files"

    def inputs(self, family: str) -> tuple[str, ...]:
        return (f"{family}.jsonl",)

    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]:
        return {n: len(b) for n, b in files.items()}


class BrokenEncoder(EchoEncoder):
    name = "broken"

    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]:
        raise RuntimeError("boom")


def _entry_points(*eps: EntryPoint) -> Any:
    return lambda group: [e for e in eps if e.group == group]


def test_entry_point_plugin_is_served(evidence: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("echo", f"{__name__}:EchoEncoder", "medomni.encoders")
    shadow = EntryPoint("ecg-summary", f"{__name__}:EchoEncoder", "medomni.encoders")
    monkeypatch.setattr(enc_mod, "entry_points", _entry_points(ep, shadow))
    found = encoders()
    assert isinstance(found["echo"], EchoEncoder)
    assert isinstance(found["ecg-summary"], EcgSummary)  # built-ins win
    gw = Gateway(evidence, ["vitals"], budget=2)
    r = post(TestClient(gw.app), {"encoder": "echo"})
    assert r.json()["features"] == {"vitals.jsonl": (evidence / "vitals.jsonl").stat().st_size}
    assert {e["name"] for e in gw.encoders_served()} == {"echo", "table-summary"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no_such_module_xyz:Encoder", "does not load: ModuleNotFoundError"),
        (f"{__name__}:NOT_AN_ENCODER", "str is not an Encoder"),
        (f"{__name__}:BrokenEncoder", "named 'broken', not 'echo'"),
    ],
)
def test_broken_plugin_names_its_entry_point(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    ep = EntryPoint("echo", value, "medomni.encoders")
    monkeypatch.setattr(enc_mod, "entry_points", _entry_points(ep))
    with pytest.raises(EncoderRegistryError, match=r"entry point medomni\.encoders 'echo'") as e:
        encoders()
    assert message in str(e.value)


def test_a_failing_encoder_is_logged_and_the_server_lives(evidence: Path) -> None:
    gw = Gateway(evidence, ["vitals"], budget=5, encoders={"broken": BrokenEncoder()})
    client = TestClient(gw.app, raise_server_exceptions=False)
    r = post(client, {"encoder": "broken"})
    assert r.status_code == 500 and "RuntimeError: boom" in r.json()["error"]
    (call,) = gw.calls
    assert (call.status, call.http_status, call.output_digest) == ("error", 500, "")
    assert call.input_digest  # it ran on these files
    assert client.get("/health").status_code == 200


# -- real servers -------------------------------------------------------------------------------
def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_uvicorn_server_on_a_free_port(evidence: Path) -> None:
    gw = Gateway(evidence, ALL, budget=3, atom="a1")
    with serve(gw, host="127.0.0.1", port=0) as url:
        port = int(url.rsplit(":", 1)[1])
        assert port > 0 and url == f"http://127.0.0.1:{port}"
        assert _get(f"{url}/health") == {"ok": True}
        assert len(_get(f"{url}/v1/encoders")) == 2
        # ten calls at once against a budget of three: exactly three are served
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            codes = list(
                pool.map(
                    lambda _: _post(f"{url}/v1/encode", {"encoder": "ecg-summary"})[0], range(10)
                )
            )
        assert sorted(codes) == [200] * 3 + [429] * 7
    assert sorted(c.seq for c in gw.calls) == list(range(1, 11))
    with pytest.raises(urllib.error.URLError):  # stopped
        _get(f"{url}/health")


def test_serve_reports_a_port_it_cannot_bind(evidence: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError), serve(Gateway(evidence, ALL, budget=1), port=port):
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sidecar_cli_answers_and_logs(evidence: Path, tmp_path: Path) -> None:
    port, log = _free_port(), tmp_path / "calls.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "medomni_cas.bench.perception",
        "--evidence",
        str(evidence),
        "--families",
        "ecg,labs",
        "--budget",
        "1",
        "--atom",
        "cafe",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log",
        str(log),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                assert _get(f"{url}/health") == {"ok": True}
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the sidecar did not answer"
                time.sleep(0.05)
        names = {e["name"]: e["families"] for e in _get(f"{url}/v1/encoders")}
        assert names == {"ecg-summary": ["ecg"], "table-summary": ["labs"]}
        assert _post(f"{url}/v1/encode", {"encoder": "ecg-summary"})[0] == 200
        assert _post(f"{url}/v1/encode", {"encoder": "ecg-summary"})[0] == 429
    finally:
        proc.terminate()
        # uvicorn shuts down cleanly on SIGTERM, then re-raises it to exit as terminated
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
        if proc.stderr:
            proc.stderr.close()
    assert [(c.atom, c.status) for c in read_call_log(log)] == [
        ("cafe", "ok"),
        ("cafe", "refused"),
    ]


def test_pickle_is_never_loaded() -> None:
    # an object array in an evidence file must not run code: numpy refuses it
    raw = _npy(np.array([pickle.dumps(1)], dtype=object))
    with pytest.raises(ValueError, match="not a readable"):
        EcgSummary().encode({"ecg.signal.npy": raw}, {})
