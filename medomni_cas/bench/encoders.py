"""Perception encoders: what the gateway serves, and the registry that finds them.

An encoder reads the files of one staged family of one patient and returns JSON-able
features. It is identified by ``name`` and ``digest``: the digest names the exact encoder
served (for an in-process encoder, the BLAKE3 hash of its name, version and parameters; for a
container-served one, its image digest), so a run record can say which encoder answered.

Encoders plug in by entry point, group ``medomni.encoders`` (name -> an `Encoder` instance or
a class taking no arguments). The built-ins, ``ecg-summary`` and ``table-summary``, are in the
registry whether or not the package is installed; a plug-in of the same name does not replace
them, as with arms.
"""

from __future__ import annotations

import abc
import fnmatch
import io
import json
import math
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

import blake3
import msgspec
import numpy as np

from medomni_cas.errors import MedomniError

__all__ = [
    "DEFAULT_LEVEL",
    "ENCODERS_GROUP",
    "LEVELS",
    "BaseEncoder",
    "EcgSummary",
    "Encoder",
    "EncoderError",
    "EncoderRegistryError",
    "TableSummary",
    "canonical_json",
    "encoders",
    "input_names",
    "level_of",
    "reset_registry",
]

ENCODERS_GROUP = "medomni.encoders"

#: What an encoder's features are, which the call log records per call (`EncoderCall.level`)
#: so a score can tell what the agent was handed: ``measurements`` (numbers read off the
#: signal or the table: rates, intervals, amplitudes, counts, means), ``embedding`` (a learned
#: vector), ``findings`` (clinical interpretations in words, such as "atrial fibrillation").
LEVELS = ("measurements", "embedding", "findings")
#: The level of an encoder that does not declare one.
DEFAULT_LEVEL = "measurements"

# Sorted keys: the same features give the same bytes, hence the same output digest.
_CANONICAL = msgspec.json.Encoder(order="sorted")


def canonical_json(value: Any) -> bytes:
    """Canonical JSON (sorted keys, no whitespace): what digests of features are taken over."""
    return _CANONICAL.encode(value)


class EncoderError(MedomniError, ValueError):
    """An encoder cannot use these files or parameters (the caller's fault, not a crash)."""


class EncoderRegistryError(MedomniError, RuntimeError):
    """A ``medomni.encoders`` entry point that does not load or is not an encoder."""


@runtime_checkable
class Encoder(Protocol):
    """What the gateway needs of an encoder.

    Optional: ``inputs(family) -> tuple[str, ...]``, the file-name patterns (``fnmatch``) it
    reads from a family (default ``<family>.*``, the array layout),
    ``required(family)``, those that must match a file for it to be served (default: all),
    and ``level``, one of `LEVELS` (default `DEFAULT_LEVEL`).
    """

    name: str
    version: str
    families: tuple[str, ...]
    description: str

    @property
    def digest(self) -> str: ...

    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]: ...


class BaseEncoder(abc.ABC):
    """An in-process encoder: subclasses set the class attributes and implement `encode`.

    ``params`` are the fixed parameters of this instance (part of its digest); per-call
    ``params`` of `encode` are the caller's, checked against ``call_params``.
    """

    name: str
    version: str
    families: tuple[str, ...]
    description: str
    level: ClassVar[str] = DEFAULT_LEVEL
    call_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = dict(params)

    @property
    def digest(self) -> str:
        # Name, version and parameters only: stable across runs, machines and refactors.
        ident = {"kind": "medomni.encoder", "name": self.name, "version": self.version}
        return blake3.blake3(canonical_json(ident | {"params": self.params})).hexdigest()

    def inputs(self, family: str) -> tuple[str, ...]:
        """File-name patterns read for ``family``; by default the array layout ``<family>.*``."""
        return (f"{family}.*",)

    def required(self, family: str) -> tuple[str, ...]:
        return self.inputs(family)

    def check_params(self, params: Mapping[str, Any]) -> None:
        unknown = sorted(set(params) - set(self.call_params))
        if unknown:
            known = ", ".join(self.call_params) or "none"
            raise EncoderError(f"{self.name}: unknown params {unknown} (it takes: {known})")

    @abc.abstractmethod
    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]:
        """Features of one patient's files of one family (JSON-able, no NaN)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.version} {self.digest[:12]}>"


def level_of(encoder: Encoder) -> str:
    """The encoder's `level` (what its features are), `DEFAULT_LEVEL` when it names none."""
    level = getattr(encoder, "level", None)
    return level if isinstance(level, str) and level else DEFAULT_LEVEL


def input_names(encoder: Encoder, family: str, names: Sequence[str]) -> list[str] | None:
    """The files of ``names`` that ``encoder`` reads for ``family``, in name order.

    None when it reads nothing there, or a required pattern matches no file: then the
    encoder cannot be served for ``family``.
    """
    inputs = getattr(encoder, "inputs", None)
    patterns = tuple(inputs(family)) if inputs is not None else (f"{family}.*",)
    required = getattr(encoder, "required", None)
    for pattern in tuple(required(family)) if required is not None else patterns:
        if not fnmatch.filter(names, pattern):
            return None
    found = sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    return found or None


# -- ecg-summary ----------------------------------------------------------------------------
_STANDARD_LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")


def _r1(x: float | np.floating[Any] | None) -> float | None:
    """One decimal, and None for what JSON cannot hold: small float noise never shows."""
    if x is None or not math.isfinite(float(x)):
        return None
    return round(float(x), 1)


def _moving_mean(x: np.ndarray, w: int) -> np.ndarray:
    if w <= 1 or len(x) < w:
        return x.copy()
    c = np.cumsum(np.concatenate([[0.0], x]))
    out = (c[w:] - c[:-w]) / w
    pad = len(x) - len(out)
    return np.concatenate([np.full(pad // 2, out[0]), out, np.full(pad - pad // 2, out[-1])])


def _baseline(x: np.ndarray, fs: float) -> np.ndarray:
    """The isoelectric level: a 1 s running median (QRS and T are a minority of any second)."""
    w, step = max(1, int(fs)), max(1, int(fs / 10))
    if len(x) <= w:
        return np.full(len(x), float(np.median(x)))
    med = np.median(np.lib.stride_tricks.sliding_window_view(x, w)[::step], axis=1)
    centers = np.arange(len(med)) * step + w / 2
    return np.interp(np.arange(len(x)), centers, med)


def _bandpass(y: np.ndarray, fs: float, lo: float = 5.0, hi: float = 20.0) -> np.ndarray:
    """QRS band (as Pan-Tompkins): mirror-padded so the FFT's wrap-around makes no edge beat."""
    pad = min(len(y) - 1, int(fs))
    z = np.pad(y, pad, mode="reflect")
    spectrum = np.fft.rfft(z)
    f = np.fft.rfftfreq(len(z), 1.0 / fs)
    spectrum[(f < lo) | (f > hi)] = 0
    return np.fft.irfft(spectrum, n=len(z))[pad : pad + len(y)]


def _noise_std(y: np.ndarray) -> float:
    """White-noise level from the first difference's MAD: the few steep QRS samples do not count."""
    d = np.diff(y)
    return float(np.median(np.abs(d - np.median(d))) * 1.4826 / math.sqrt(2))


def _r_peaks(y: np.ndarray, fs: float) -> np.ndarray:
    """R peaks of one baseline-free lead: slope energy over a threshold, 250 ms refractory."""
    bp = _bandpass(y, fs)
    d = np.diff(bp, prepend=bp[0])
    energy = _moving_mean(d * d, max(1, int(0.08 * fs)))
    top = float(np.percentile(energy, 99))
    if top <= 0:
        return np.zeros(0, dtype=np.int64)
    above = energy > 0.25 * top
    starts = np.flatnonzero(above[1:] & ~above[:-1]) + 1
    ends = np.flatnonzero(~above[1:] & above[:-1]) + 1
    if above[0]:
        starts = np.concatenate([[0], starts])
    if above[-1]:
        ends = np.concatenate([ends, [len(y)]])
    # the polarity of the lead's largest deflections: an inverted lead still has its R peaks
    sign = 1.0 if np.percentile(y, 99.9) >= -np.percentile(y, 0.1) else -1.0
    half, refractory = int(0.05 * fs), int(0.25 * fs)
    peaks: list[tuple[int, float]] = []
    for s, t in zip(starts, ends, strict=True):
        a, b = max(0, int(s) - half), min(len(y), int(t) + half)
        p, e = a + int(np.argmax(sign * y[a:b])), float(energy[s:t].max())
        if peaks and p - peaks[-1][0] < refractory:
            if e > peaks[-1][1]:  # the steeper of two close candidates is the QRS
                peaks[-1] = (p, e)
        else:
            peaks.append((p, e))
    edge = int(0.05 * fs)  # a QRS cut by the record's edge has no trustworthy peak
    found = np.array([p for p, _ in peaks if edge <= p < len(y) - edge], dtype=np.int64)
    if len(found) == 0:
        return found
    amp = sign * y[found]
    # tall T waves and noise bursts are well under the typical R peak
    return found[amp >= 0.4 * float(np.median(amp))]


class EcgSummary(BaseEncoder):
    """ecg-summary: rate, rhythm regularity, QRS and T amplitudes and noise of a 12-lead ECG."""

    name = "ecg-summary"
    version = "1.0.0"
    families: tuple[str, ...] = ("ecg",)
    description = (
        "Summary features of a resting 12-lead ECG: heart rate and RR intervals (R peaks on "
        "the rhythm lead), QRS amplitude and noise per lead, T-wave amplitude, signal quality."
    )
    call_params = ("rhythm_lead",)

    def __init__(self, *, rhythm_lead: str = "II", t_window_ms: tuple[int, int] = (150, 400)):
        super().__init__(rhythm_lead=rhythm_lead, t_window_ms=list(t_window_ms))

    def inputs(self, family: str) -> tuple[str, ...]:
        return (f"{family}.signal.npy", f"{family}.attrs.json")

    def required(self, family: str) -> tuple[str, ...]:
        return (f"{family}.signal.npy",)

    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]:
        self.check_params(params)
        # the gateway passes one family's files: <family>.signal.npy and <family>.attrs.json
        sig_name = next((n for n in sorted(files) if n.endswith(".signal.npy")), "signal.npy")
        family = sig_name.removesuffix(".signal.npy")
        notes: list[str] = []
        attrs = self._attrs(files.get(f"{family}.attrs.json"), notes)
        signal = self._signal(files.get(sig_name))
        leads = attrs.get("leads")
        if not isinstance(leads, list) or not all(isinstance(x, str) for x in leads):
            leads = list(_STANDARD_LEADS)
            notes.append("attrs name no leads: assumed the standard 12-lead order")
        if signal.shape[0] != len(leads):
            raise EncoderError(
                f"{family}.signal.npy: shape {list(signal.shape)} does not match "
                f"{len(leads)} leads (expected (leads, samples))"
            )
        fs = attrs.get("sampling_rate_hz", 500)
        if not isinstance(fs, int | float) or isinstance(fs, bool) or not 50 <= fs <= 20_000:
            raise EncoderError(f"{family}.attrs.json: sampling_rate_hz {fs!r} is not usable")
        rhythm = str(params.get("rhythm_lead", self.params["rhythm_lead"]))
        if rhythm not in leads:
            raise EncoderError(f"{self.name}: no lead {rhythm!r} (leads: {', '.join(leads)})")
        return self._features(signal, [str(x) for x in leads], float(fs), rhythm, notes) | {
            "units": attrs.get("units", "uV")
        }

    @staticmethod
    def _attrs(raw: bytes | None, notes: list[str]) -> dict[str, Any]:
        if raw is None:
            notes.append("no attrs file: assumed 500 Hz")
            return {}
        try:
            attrs = json.loads(raw)
        except ValueError as e:
            raise EncoderError(f"attrs: not JSON ({e})") from None
        if not isinstance(attrs, dict):
            raise EncoderError("attrs: not a JSON object")
        return attrs

    @staticmethod
    def _signal(raw: bytes | None) -> np.ndarray:
        if raw is None:
            raise EncoderError("no signal file")
        try:
            # allow_pickle=False: an evidence file must never run code
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
        except Exception as e:  # truncated or not .npy: numpy raises several kinds
            raise EncoderError(f"signal: not a readable .npy file ({e})") from None
        if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.dtype.kind not in "iuf":
            shape = list(getattr(arr, "shape", []))
            raise EncoderError(f"signal: expected a 2-D numeric array, got {shape} {arr.dtype}")
        return arr.astype(np.float64)

    def _features(
        self, signal: np.ndarray, leads: list[str], fs: float, rhythm: str, notes: list[str]
    ) -> dict[str, Any]:
        n = signal.shape[1]
        signal = np.where(np.isfinite(signal), signal, 0.0)
        clean = signal - np.stack([_baseline(x, fs) for x in signal]) if n >= 2 else signal * 0.0
        noise = [_noise_std(x) if n >= 3 else float("nan") for x in clean]
        y = clean[leads.index(rhythm)]
        peaks = np.zeros(0, dtype=np.int64)
        quality = "ok"
        if n < 2 * fs:
            quality = "too short"
            notes.append(f"{n / fs:.2f} s of signal: at least 2 s are needed for a rate")
        elif float(np.ptp(y)) < 1e-9:
            quality = "flat"
            notes.append(f"lead {rhythm} is flat")
        else:
            peaks = _r_peaks(y, fs)
            amp = float(np.median(np.abs(y[peaks]))) if len(peaks) else 0.0
            lead_noise = noise[leads.index(rhythm)]
            if len(peaks) < 2:
                quality = "no beats"
                notes.append(f"fewer than 2 R peaks found on lead {rhythm}")
                peaks = np.zeros(0, dtype=np.int64)
            elif math.isfinite(lead_noise) and amp < 5.0 * lead_noise:
                # peaks no taller than the noise are the noise's own
                quality = "noisy"
                notes.append(f"R peaks on lead {rhythm} are under 5x the noise level")
                peaks = np.zeros(0, dtype=np.int64)
        rr = np.diff(peaks) / fs
        if len(rr) and (rr.min() < 0.2 or rr.max() > 3.0):
            quality = "implausible rhythm"
            notes.append("RR intervals outside 200-3000 ms: rate not reported")
            rr, peaks = rr[:0], peaks[:0]
        mean_rr = float(rr.mean()) if len(rr) else float("nan")
        return {
            "leads": leads,
            "sampling_rate_hz": _r1(fs),
            "duration_s": _r1(n / fs),
            "rhythm_lead": rhythm,
            "beats": len(peaks),
            "heart_rate_bpm": _r1(60.0 / mean_rr) if len(rr) else None,
            "rr_mean_ms": _r1(1000.0 * mean_rr) if len(rr) else None,
            "rr_std_ms": _r1(1000.0 * float(rr.std())) if len(rr) else None,
            "t_wave_amplitude_uv": self._t_wave(y, peaks, fs, mean_rr),
            "per_lead": {
                lead: {
                    "qrs_amplitude_uv": self._qrs(clean[i], peaks, fs),
                    "noise_std_uv": _r1(noise[i]),
                }
                for i, lead in enumerate(leads)
            },
            "noise_std_uv": _r1(float(np.median(noise))) if noise else None,
            "quality": quality,
            "notes": notes,
        }

    @staticmethod
    def _qrs(x: np.ndarray, peaks: np.ndarray, fs: float) -> float | None:
        """Median peak-to-peak in +-50 ms around each R peak."""
        if not len(peaks):
            return None
        h = int(0.05 * fs)
        return _r1(np.median([np.ptp(x[max(0, p - h) : p + h + 1]) for p in peaks]))

    def _t_wave(self, y: np.ndarray, peaks: np.ndarray, fs: float, rr: float) -> float | None:
        """Mean of each beat's maximum in the T window after its R peak.

        The window (150-400 ms at 60 bpm) scales with sqrt(RR), as the QT interval does
        (Bazett), and stops at 60% of RR so that it never reaches the next beat.
        """
        if len(peaks) < 1 or not math.isfinite(rr):
            return None
        lo_ms, hi_ms = self.params["t_window_ms"]
        scale = math.sqrt(rr)
        lo = int(lo_ms / 1000 * scale * fs)
        hi = min(int(hi_ms / 1000 * scale * fs), int(0.6 * rr * fs))
        tops = [float(y[p + lo : p + hi].max()) for p in peaks if p + hi <= len(y) and hi > lo]
        return _r1(np.mean(tops)) if tops else None


# -- table-summary --------------------------------------------------------------------------
#: medomni-v1's table files per family (``<table>.jsonl``, demographics in ``patients``).
DEFAULT_TABLES = {
    "demographics": "patients.jsonl",
    "encounters": "encounters.jsonl",
    "vitals": "vitals.jsonl",
    "labs": "labs.jsonl",
    "medications": "medications.jsonl",
}


class TableSummary(BaseEncoder):
    """table-summary: row count, time span, numeric and categorical summaries of a JSONL table."""

    name = "table-summary"
    version = "1.0.0"
    description = (
        "Summary of a tabular family: row count, time span, per-column numeric statistics "
        "(count, mean, min, max) and category counts; optionally grouped by one column "
        '(params {"by": "test"}).'
    )
    call_params = ("by",)
    MAX_CATEGORIES: ClassVar[int] = 20
    MAX_GROUPS: ClassVar[int] = 50

    def __init__(
        self, *, tables: Mapping[str, str] | None = None, time_column: str = "time"
    ) -> None:
        tables = dict(DEFAULT_TABLES if tables is None else tables)
        super().__init__(tables=tables, time_column=time_column)
        self.tables = tables
        self.families = tuple(tables)

    def inputs(self, family: str) -> tuple[str, ...]:
        return (self.tables[family],) if family in self.tables else ()

    def encode(self, files: Mapping[str, bytes], params: Mapping[str, Any]) -> dict[str, Any]:
        self.check_params(params)
        if len(files) != 1:
            raise EncoderError(f"{self.name}: expected one table file, got {sorted(files)}")
        ((fname, raw),) = files.items()
        rows: list[dict[str, Any]] = []
        for i, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise EncoderError(f"{fname}:{i}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise EncoderError(f"{fname}:{i}: not a JSON object")
            rows.append(row)
        by = params.get("by")
        out = {"file": fname, "rows": len(rows)} | self._summary(rows)
        if by is None:
            return out
        if not isinstance(by, str) or (rows and not any(by in r for r in rows)):
            raise EncoderError(f"{self.name}: {fname} has no column {by!r} to group by")
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(str(r.get(by)), []).append(r)
        if len(groups) > self.MAX_GROUPS:
            raise EncoderError(
                f"{self.name}: {by!r} has {len(groups)} values (max {self.MAX_GROUPS})"
            )
        out["by"] = by
        out["groups"] = {
            k: {"rows": len(v)} | self._summary(v, skip=by) for k, v in sorted(groups.items())
        }
        return out

    def _summary(self, rows: list[dict[str, Any]], skip: str | None = None) -> dict[str, Any]:
        tcol = self.params["time_column"]
        times = sorted(str(r[tcol]) for r in rows if isinstance(r.get(tcol), str))
        columns: dict[str, Any] = {}
        names = list(dict.fromkeys(k for r in rows for k in r))
        for col in names:
            if col in (tcol, skip):
                continue
            values = [r.get(col) for r in rows]
            nums = [
                float(v)
                for v in values
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            ]
            cats = [str(v) for v in values if isinstance(v, str | bool)]
            if nums and len(nums) >= len(cats):
                columns[col] = {
                    "count": len(nums),
                    "mean": _round(sum(nums) / len(nums)),
                    "min": _round(min(nums)),
                    "max": _round(max(nums)),
                }
            elif cats:
                counts: dict[str, int] = {}
                for c in cats:
                    counts[c] = counts.get(c, 0) + 1
                top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                columns[col] = {
                    "count": len(cats),
                    "distinct": len(counts),
                    "top": dict(top[: self.MAX_CATEGORIES]),
                }
        return {
            "first_time": times[0] if times else None,
            "last_time": times[-1] if times else None,
            "columns": columns,
        }


def _round(x: float) -> float | int:
    """Four significant decimals: means of lab values need no more, and digests stay stable."""
    return int(x) if float(x).is_integer() else round(x, 4)


# -- registry -------------------------------------------------------------------------------
def _builtin() -> dict[str, Encoder]:
    return {e.name: e for e in (EcgSummary(), TableSummary())}


_registry: dict[str, Encoder] | None = None


def encoders() -> dict[str, Encoder]:
    """Every encoder by name: the built-ins, then ``medomni.encoders`` plug-ins (read once)."""
    global _registry
    if _registry is None:
        found = _builtin()
        for ep in entry_points(group=ENCODERS_GROUP):
            if ep.name in found:
                continue  # built-ins win, as with arms: they may be registered by entry point too
            found[ep.name] = _load(ep)
        _registry = found
    return dict(_registry)


def _load(ep: Any) -> Encoder:
    where = f"entry point {ENCODERS_GROUP} {ep.name!r} ({ep.value})"
    try:
        obj = ep.load()
        enc = obj() if isinstance(obj, type) else obj
    except Exception as e:
        raise EncoderRegistryError(f"{where}: does not load: {type(e).__name__}: {e}") from e
    if not isinstance(enc, Encoder):
        raise EncoderRegistryError(f"{where}: {type(enc).__name__} is not an Encoder")
    if enc.name != ep.name:
        raise EncoderRegistryError(f"{where}: the encoder is named {enc.name!r}, not {ep.name!r}")
    if not enc.families or not all(isinstance(f, str) for f in enc.families):
        raise EncoderRegistryError(f"{where}: names no families")
    if level_of(enc) not in LEVELS:
        raise EncoderRegistryError(
            f"{where}: level {level_of(enc)!r} is not one of {', '.join(LEVELS)}"
        )
    return enc


def reset_registry() -> None:
    """Forget loaded plug-ins, so that the next lookup reads the entry points again."""
    global _registry
    _registry = None
