"""Secrets never enter the store: a known key, leaked by an agent every way it can, is in none
of the bytes of the store, a bundle exported from it, or the run folder."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

import medomni_cas as mc
from medomni_cas.bench.agents import load_agent
from medomni_cas.bench.harness import run_set
from medomni_cas.bench.process import now_iso
from medomni_cas.bench.runners import Job, Runner, Trial
from medomni_cas.bench.secrets import Redactor, redactor, secret_names
from medomni_cas.cli.main import main
from medomni_cas.store.ids import ObjectId
from tests.llm_provider import Reply, standin
from tests.test_llm_agent import ANSWER, KEY, SET, llm_config, llm_tree, run

pytest.importorskip("openai")

TOKEN = "ghp_someoneelsestoken42"  # a bearer token the agent found somewhere: not configured


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_tree(tmp_path_factory.mktemp("secrets"), n=3)


LEAKY = """
    import json, os, runpy, sys
    key = os.environ["OPENAI_API_KEY"]
    print("configured with", key)
    print("Authorization: Bearer " + os.environ["LEAKY_EXTRA"], file=sys.stderr)
    sys.argv = ["llm_agent"]
    runpy.run_module("examples.llm_agent", run_name="__main__")
"""


def _files(root: Path) -> Iterator[Path]:
    yield from (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_key_leaked_by_the_agent_is_in_no_stored_byte(
    tree: Path,
    tmp_path: Path,
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEAKY_EXTRA", TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    script = tmp_path / "leaky.py"
    script.write_text(textwrap.dedent(LEAKY))

    # the model echoes the key into the answer once, and the run's model name once
    def reply(n: int, _body: dict[str, object]) -> Reply:
        if n == 0:
            return Reply(content=json.dumps({"ckd_stage": "G2", "note": KEY}))
        if n == 1:
            return Reply(content=ANSWER, model=f"model-{KEY}")
        return Reply(content=ANSWER)

    with standin(reply) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        env = ["OPENAI_BASE_URL", "OPENAI_API_KEY", "LEAKY_EXTRA"]
        agent = llm_config(tree, tmp_path, "leaky", env=env, command=["python", str(script)])
        code, report = run(tree, tmp_path, url, agent, capsys)
        assert code == 1  # one answer is malformed (it holds a key the schema does not)
        assert provider.authorizations == [f"Bearer {KEY}"] * 3  # the agent had the key
    (job,) = report["jobs"]
    assert job["ran"] == 3 and job["outcomes"]["answered"] == 1

    folder = Path(job["folder"])
    stdout = (next(folder.glob("trials/*/stdout.txt"))).read_text()
    assert "configured with [redacted:OPENAI_API_KEY]" in stdout
    stderr = (next(folder.glob("trials/*/stderr.txt"))).read_text()
    assert "Authorization: Bearer [redacted]" in stderr

    bundle = tmp_path / "out.bundle"
    assert main(["cas", "export", job["job"], "-o", str(bundle), "--store", url]) == 0
    with mc.open(url) as s:
        closure = s.closure(ObjectId.from_hex(job["job"]))
        assert len(closure) > 20
        stored = b"".join(s.get_raw(o) for o in closure)
    # every byte the test made: the store's files, the bundle, the run folder, the scratch
    every = [stored, *(p.read_bytes() for p in _files(tmp_path))]
    assert bundle.stat().st_size and (tmp_path / "store").is_dir()
    for secret in (KEY, TOKEN):
        assert [i for i, data in enumerate(every) if secret.encode() in data] == []


HIDES = """
    import os, pathlib
    key = os.environ["OPENAI_API_KEY"]
    print("configured with", key)
    pathlib.Path(os.environ["TMPDIR"], "cache.json").write_text(key)
    hidden = pathlib.Path("deep")
    hidden.mkdir()
    (hidden / "note").write_text("Bearer " + os.environ["LEAKY_EXTRA"])
    os.chmod(hidden / "note", 0)
    os.chmod(hidden, 0)  # neither listed nor read, unless made ours again
    pathlib.Path(os.environ["MEDOMNI_SUBMISSION"]).write_text('{"ckd_stage": "G2"}')
"""


def test_a_kept_scratch_folder_holds_no_secret(
    tree: Path,
    tmp_path: Path,
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--runner-option keep=1`` keeps each trial's folder for debugging: the agent's logs
    and files are there, redacted as the stored records are, even a file the agent hid in a
    folder it made unreadable."""
    monkeypatch.setenv("LEAKY_EXTRA", TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    script = tmp_path / "hides.py"
    script.write_text(textwrap.dedent(HIDES))
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never asked
    env = ["OPENAI_BASE_URL", "OPENAI_API_KEY", "LEAKY_EXTRA"]
    agent = llm_config(tree, tmp_path, "hides", env=env, command=["python", str(script)])
    code, report = run(tree, tmp_path, url, agent, capsys, "--runner-option", "keep=1")
    assert code == 0 and report["jobs"][0]["outcomes"] == {"answered": 3}
    (kept,) = (tmp_path / "runs/.scratch").glob("kept-*")
    files = list(_files(kept))
    names = {p.name for p in files}
    assert {"stdout.txt", "stderr.txt", "cache.json", "note", "labs.jsonl"} <= names, names
    assert len([p for p in files if p.name == "note"]) == 3  # one a trial, read and kept
    stdout = next(p for p in files if p.name == "stdout.txt").read_text()
    assert "configured with [redacted:OPENAI_API_KEY]" in stdout
    assert next(p for p in files if p.name == "note").read_bytes() == b"Bearer [redacted]"
    for secret in (KEY, TOKEN):
        assert [p for p in files if secret.encode() in p.read_bytes()] == []


def test_secret_names_are_the_named_and_those_env_names_that_say_so(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(
        textwrap.dedent(
            """
            kind: agent
            agent: a
            model: m
            route: local
            settings:
              scaffold: process
              served_model: m
              env: [OPENAI_BASE_URL, HF_TOKEN, MY_API_KEY, LANGUAGE]
              secrets: [PROVIDER_CREDS]
              command: [python, -c, pass]
            """
        )
    )
    agent = load_agent(path)
    assert secret_names(agent) == ["PROVIDER_CREDS", "HF_TOKEN", "MY_API_KEY"]
    env = {"PROVIDER_CREDS": "creds-123456", "HF_TOKEN": "hf_abcdefgh", "MY_API_KEY": "short"}
    r = redactor(agent, env)
    trial = Trial(
        slot=ObjectId(bytes(32)), attempt=1, outcome="answered", started="", finished="",
        elapsed_ms=0, answer=b'{"x": "hf_abcdefgh"}', errors=["failed with creds-123456"],
        logs={"stderr.txt": b"hf_abcdefgh creds-123456 short Bearer abc.def-ghi_jkl"},
    )  # fmt: skip
    r.trial(trial)
    assert trial.answer == b'{"x": "[redacted:HF_TOKEN]"}'
    assert trial.errors == ["failed with [redacted:PROVIDER_CREDS]"]
    # a value too short to be a key is left alone; any bearer token goes
    assert trial.logs["stderr.txt"] == (
        b"[redacted:HF_TOKEN] [redacted:PROVIDER_CREDS] short Bearer [redacted]"
    )


def test_a_folder_is_redacted_in_place(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/log.txt").write_bytes(b"key=sk-live-999999 ok")
    (tmp_path / "clean.txt").write_bytes(b"nothing")
    r = Redactor((("K", b"sk-live-999999"),))
    assert r.folder(tmp_path) == 1
    assert (tmp_path / "a/log.txt").read_bytes() == b"key=[redacted:K] ok"


def test_a_hard_link_to_a_file_elsewhere_leaves_that_file_as_it_is(tmp_path: Path) -> None:
    """An agent's folder may hold a hard link to a file outside it: the folder's copy is
    redacted, the file elsewhere keeps its bytes and its mode."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"key=sk-live-999999")
    outside.chmod(0o400)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "linked.txt").hardlink_to(outside)
    assert Redactor((("K", b"sk-live-999999"),)).folder(kept) == 1
    assert (kept / "linked.txt").read_bytes() == b"key=[redacted:K]"
    assert outside.read_bytes() == b"key=sk-live-999999" and outside.stat().st_mode & 0o777 == 0o400


class _KeepsLogs(Runner):
    """A third-party runner that keeps files of its own in the run folder, as Harbor's does."""

    name: ClassVar[str] = "keeps-logs"

    def run(self, job: Job) -> Iterator[Trial]:
        for spec in job.trials:
            own = job.folder / "own" / spec.slot.hex()[:12]
            own.mkdir(parents=True)
            (own / "agent.log").write_text(f"calling with {KEY}\nAuthorization: Bearer {TOKEN}\n")
            yield Trial(
                slot=spec.slot, attempt=spec.attempt, outcome="answered", started=now_iso(),
                finished=now_iso(), elapsed_ms=1, answer=ANSWER.encode(), served_model="m",
            )  # fmt: skip


def test_files_a_runner_keeps_in_the_run_folder_are_redacted(
    tree: Path, tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never asked
    agent = load_agent(llm_config(tree, tmp_path, served_model="m"))
    with mc.open(url) as s:
        report = run_set(
            s, SET, agent, runs_dir=tmp_path / "runs", studio=tree / "studio",
            bench=tree / "bench", runner=_KeepsLogs(),
        )  # fmt: skip
    (job,) = report.jobs
    logs = sorted((job.folder / "own").rglob("agent.log"))
    assert len(logs) == 3
    assert logs[0].read_text() == (
        "calling with [redacted:OPENAI_API_KEY]\nAuthorization: Bearer [redacted]\n"
    )
    every = [p.read_bytes() for p in _files(tmp_path)]
    assert not [d for d in every if KEY.encode() in d or TOKEN.encode() in d]
