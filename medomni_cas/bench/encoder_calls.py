"""An encode call as the perception gateway logged it, and whether a run's calls meet its arm.

Apart from the gateway (`medomni_cas.bench.perception`), so that the harness and the runners
read call logs without importing the gateway's web stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec

__all__ = ["EncoderCall", "Status", "meets_arm", "read_call_log"]

Status = Literal["ok", "refused", "error"]


class EncoderCall(msgspec.Struct, frozen=True, kw_only=True):
    """One encode call, as the gateway answered it (refused calls too).

    ``input_digest`` is the BLAKE3 hash of the input files' bytes concatenated in name order
    (``inputs``), ``output_digest`` that of the features' canonical JSON ("" when none).
    ``level`` is what the encoder's features are (`medomni_cas.bench.encoders.LEVELS`): ""
    when no encoder answered (a refused call), and in calls logged before calls had one.
    """

    atom: str
    seq: int
    encoder: str
    encoder_version: str
    encoder_digest: str
    family: str
    status: Status
    http_status: int
    started: str  # ISO 8601, UTC
    elapsed_ms: float
    input_digest: str
    output_digest: str
    detail: str
    inputs: tuple[str, ...] = ()
    level: str = ""


_CALL_DECODER = msgspec.json.Decoder(EncoderCall)


def read_call_log(path: str | Path) -> list[EncoderCall]:
    """The calls of a JSON-lines call log (as a sidecar writes with ``--log``)."""
    return [_CALL_DECODER.decode(line) for line in Path(path).read_bytes().splitlines() if line]


def meets_arm(arm_encoders: str, calls: Sequence[EncoderCall]) -> tuple[bool, str]:
    """Whether a run's encoder calls meet its arm's run side, and why not.

    "required" needs at least one successful call; "allowed" takes anything; "none" attaches
    no gateway, so any logged call there is a harness bug and fails the run.
    """
    ok = sum(1 for c in calls if c.status == "ok")
    if arm_encoders == "required":
        if ok:
            return True, f"{ok} successful encoder call{'s' if ok != 1 else ''}"
        refused = sum(1 for c in calls if c.status == "refused")
        failed = len(calls) - refused
        return False, (
            f"encoders required: no successful encoder call "
            f"({len(calls)} calls: {refused} refused, {failed} failed)"
        )
    if arm_encoders == "allowed":
        return True, ""
    if arm_encoders == "none":
        if calls:
            return False, (
                f"the arm attaches no perception service, yet {len(calls)} encoder calls were "
                "logged"
            )
        return True, ""
    raise ValueError(f"unknown encoder access {arm_encoders!r} (allowed, none, required)")
