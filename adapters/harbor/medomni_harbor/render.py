"""An atom task as a Harbor task folder (``task.toml`` schema 1.4)::

    <slot>-<attempt>/
      task.toml          timeouts, the image, cpus and memory, no network, the answer artifact,
                         and [metadata.medomni] (the slot, and the perception block if attached)
      instruction.md     the atom's instruction
      environment/       what the agent finds in /workspace: the staged files, exactly as every
                         runner stages them (instruction.md, answer_schema.json, evidence)
      tests/test.sh      the format check in bash and busybox; writes /logs/verifier/reward.json

The folder's name is the run slot and attempt, so a Harbor trial (``<first 32 characters of
the task name>__<random>``, its ``task_name`` in ``result.json``) maps back to exactly one
slot. No answer is ever written here, and there is no ``solution/`` — except for Harbor's
``oracle`` agent, the stand-in that is handed the answers from outside the task: its own task
folders get ``solution/solve.sh`` writing the answer key's values (see `render_task`).

For Harbor's compose-based environments (``compose=True``), ``environment/`` holds the staged
files under ``workspace/``, a ``Dockerfile`` copying only them into the agent image, and a
``docker-compose.yaml`` that closes the network (`medomni_harbor.compose`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import tomli_w

from medomni_cas.bench.runners import Job, TrialSpec
from medomni_cas.bench.staging import WORKSPACE, stage_atom
from medomni_harbor.compose import WORKSPACE_DIR, dockerfile, write_closed

__all__ = [
    "ANSWER_ARTIFACT",
    "format_check_script",
    "parse_task_name",
    "render_task",
    "set_perception_url",
    "task_name",
]

#: Where Harbor puts the collected answer, under the trial's ``artifacts/``.
ANSWER_ARTIFACT = "medomni/answer.json"
PERCEPTION_URL = "http://perception:8899"


def task_name(spec: TrialSpec) -> str:
    return f"{spec.slot.hex()}-{spec.attempt}"


def parse_task_name(name: str) -> tuple[str, int] | None:
    """``(slot hex, attempt)`` of a rendered task's name, or None for any other name."""
    slot, sep, attempt = name.rpartition("-")
    if not sep or len(slot) != 64 or not attempt.isdigit():
        return None
    try:
        bytes.fromhex(slot)
    except ValueError:
        return None
    return slot, int(attempt)


def format_check_script(submission: str, targets: list[str]) -> str:
    """The format check as a shell script: the answer exists and is a JSON object naming every
    target. It never scores; the harness repeats the full check (kinds, classes) on the host."""
    names = " ".join(f"'{t}'" for t in targets)
    return f"""#!/bin/bash
# MedOmni format check: shape only, never a score. The reward is 1 when the answer at the
# submission path is a JSON object that names every target, else 0.
answer='{submission}'
mkdir -p /logs/verifier
ok=1
if [ ! -s "$answer" ]; then
  echo "no answer at $answer"
  ok=0
else
  body=$(tr -d ' \\t\\r\\n' < "$answer")
  case "$body" in
    "{{"*"}}") ;;
    *) echo "the answer is not a JSON object"; ok=0 ;;
  esac
  for t in {names}; do
    case "$body" in
      *"\\"$t\\":"*) ;;
      *) echo "$t: missing"; ok=0 ;;
    esac
  done
fi
printf '{{"format_ok": %d}}\\n' "$ok" > /logs/verifier/reward.json
exit 0
"""


def _toml(
    job: Job,
    spec: TrialSpec,
    *,
    image: str,
    perception: bool,
    compose: bool,
    allowlist: list[str] | None = None,
) -> str:
    atom, env = spec.atom, spec.atom.environment
    agent_timeout = env.agent_timeout_sec
    if job.agent.limits.time_sec:
        agent_timeout = min(agent_timeout, job.agent.limits.time_sec)
    variables = {
        "MEDOMNI_WORKSPACE": str(WORKSPACE),
        "MEDOMNI_INSTRUCTION": str(WORKSPACE / "instruction.md"),
        "MEDOMNI_SUBMISSION": atom.submission_path,
    }
    meta: dict[str, object] = {
        "slot": spec.slot.hex(),
        "attempt": spec.attempt,
        "atom": spec.atom_id.hex(),
        "pair": atom.pair,
        "version": atom.version,
        "arm": job.arm,
        "arm_variant": job.arm_variant,
        "repetition": job.repetition,
        "config": atom.config.hex(),
    }
    if perception:
        variables["MEDOMNI_PERCEPTION_URL"] = PERCEPTION_URL
        block: dict[str, object] = {
            "families": list(atom.families),
            "budget": job.budget,
            "atom": spec.atom_id.hex(),
            "encoders": job.encoders,
        }
        if compose:  # where the job's gateway reads the staged files
            block["evidence"] = f"environment/{WORKSPACE_DIR}"
        meta["perception"] = block
    network = "public" if env.internet else "no-network"
    environment: dict[str, object] = {"docker_image": image}
    if compose:
        # the task's compose file closes the network (medomni_harbor.compose), and main's
        # image is built from environment/Dockerfile
        if not env.internet:
            meta["network"] = "closed by environment/docker-compose.yaml"
        network, environment = "public", {}
    allowed: dict[str, object] = {}
    if allowlist is not None and perception and not env.internet:
        # an egress allowlist: the agent's container reaches the job's gateway and nothing
        # else; the URL with the trial's token is written when the job starts
        network, allowed = "allowlist", {"allowed_hosts": list(allowlist)}
    doc = {
        "schema_version": "1.4",
        "artifacts": [{"source": atom.submission_path, "destination": ANSWER_ARTIFACT}],
        "metadata": {"medomni": meta},
        "verifier": {"timeout_sec": float(env.verifier_timeout_sec)},
        "agent": {"timeout_sec": float(agent_timeout)},
        "environment": {
            **environment,
            "cpus": env.cpus,
            "memory_mb": env.memory_mb,
            "workdir": str(WORKSPACE),
            "network_mode": network,
            **allowed,
            "build_timeout_sec": 300.0,
            "env": variables,
        },
    }
    return tomli_w.dumps(doc)


def solve_script(submission: str, answer: dict[str, object]) -> str:
    """The oracle's solution: write ``answer`` (the answer key's values) as the answer."""
    import msgspec

    body = msgspec.json.encode(answer).decode().replace("'", "'\\''")
    return f"""#!/bin/bash
# The oracle stand-in: the answers, handed in from outside the task, written as the answer.
mkdir -p "$(dirname '{submission}')"
printf '%s' '{body}' > '{submission}'
"""


def render_task(
    job: Job,
    spec: TrialSpec,
    root: Path,
    *,
    image: str,
    oracle_answer: dict[str, object] | None = None,
    compose: bool = False,
    allowlist: list[str] | None = None,
) -> Path:
    """Write the task folder of ``spec`` under ``root`` (replacing one left by an earlier
    run: rendering is deterministic); its path. ``oracle_answer`` is only ever given for
    Harbor's oracle agent, whose task folders alone hold ``solution/``. ``compose`` renders
    the layout of Harbor's compose-based environments (the module docstring); ``allowlist``
    (the gateway's host) makes an arm with the service an egress allowlist of that host."""
    from harbor.models.task.config import TaskConfig

    name = task_name(spec)
    final = root / name
    tmp = root / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    perception = job.encoders != "none"
    try:
        staged = tmp / "environment" / WORKSPACE_DIR if compose else tmp / "environment"
        stage_atom(job.store, spec.atom, spec.format_check, staged)
        if compose:
            (tmp / "environment" / "Dockerfile").write_text(dockerfile(image, str(WORKSPACE)))
            if not spec.atom.environment.internet:
                write_closed(tmp)  # the job replaces it with the relay's when it attaches one
        (tmp / "instruction.md").write_bytes(job.store.read_blob(spec.atom.instruction))
        text = _toml(
            job, spec, image=image, perception=perception, compose=compose, allowlist=allowlist
        )
        TaskConfig.model_validate_toml(text)  # what Harbor will read must be valid
        (tmp / "task.toml").write_text(text)
        tests = tmp / "tests"
        tests.mkdir()
        script = format_check_script(
            spec.atom.submission_path, [t.name for t in spec.format_check.targets]
        )
        (tests / "test.sh").write_text(script)
        (tests / "test.sh").chmod(0o755)
        if oracle_answer is not None:
            solution = tmp / "solution"
            solution.mkdir()
            (solution / "solve.sh").write_text(
                solve_script(spec.atom.submission_path, oracle_answer)
            )
            (solution / "solve.sh").chmod(0o755)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def set_perception_url(task_dir: Path, url: str) -> None:
    """The trial's ``MEDOMNI_PERCEPTION_URL`` (the gateway's address and its token), for an
    egress-allowlist environment, where the agent reaches the job's gateway directly."""
    import tomllib

    path = task_dir / "task.toml"
    doc = tomllib.loads(path.read_text())
    doc["environment"]["env"]["MEDOMNI_PERCEPTION_URL"] = url
    path.write_text(tomli_w.dumps(doc))
