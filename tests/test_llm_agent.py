"""The model-backed process agent (examples/llm_agent.py) against the stand-in provider.

Each test runs ``medomni bench run`` (in process) with the example config
``bench/agents/llm-local.yaml``, the real ``openai`` client in a real agent subprocess, and a
stand-in provider on loopback (tests/llm_provider.py) scripted for the case: answers, the
served model, usage past the limits, a hang, 5xx and time-outs, a malformed body. The agent
reaches the stand-in through the process runner's endpoint relay, whose log decides whether
an agent's infrastructure-error claim counts (a hostile agent's does not).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

import medomni_cas as mc
from medomni_cas.bench.records import RunRecord
from medomni_cas.cli.main import main
from tests._sets import EXAMPLES, small_tree
from tests.llm_fixtures import SET
from tests.llm_provider import Reply, standin

pytest.importorskip("openai")

N = 8  # slots of the set's one job
NOP = ["--arm", "no-perception"]
MODEL = "stand-in-model"
KEY = "sk-test-0123456789abcdef"
ANSWER = '{"ckd_stage": "G2"}'


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_tree(tmp_path_factory.mktemp("llm"))


def llm_tree(root: Path, n: int = N) -> Path:
    """The example trees with a set of one pair of ``n`` patients (each run of the agent
    starts a Python that imports ``openai``: seconds on a loaded machine)."""
    cohorts = EXAMPLES / "studio/datasets/synth-ehr/tasks/synth-ehr_ckd-staging/cohorts"
    doc = yaml.safe_load((cohorts / "n20.yaml").read_text())
    doc.pop("per_class", None)  # every eligible patient in seeded order, the first n
    doc.update(n=n, description=f"{n} patients, for the LLM agent tests.")
    tree = small_tree(root, arms=["no-perception"], pairs=(f"synth-ehr_ckd-staging@n{n}",))
    mine = tree / "studio/datasets/synth-ehr/tasks/synth-ehr_ckd-staging/cohorts"
    (mine / f"n{n}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tree


@pytest.fixture(autouse=True)
def _endpoint_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def llm_config(
    tree: Path,
    tmp_path: Path,
    name: str = "llm",
    *,
    args: Sequence[str] = (),
    **settings: Any,
) -> Path:
    """The example llm-local config, serving the stand-in's model, with ``settings`` set."""
    doc = yaml.safe_load((tree / "bench/agents/llm-local.yaml").read_text())
    doc["agent"] = name
    doc["model"] = doc["settings"]["served_model"] = MODEL
    doc["settings"]["command"] = [*doc["settings"]["command"], *args]
    doc["settings"].update(settings)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(
    tree: Path,
    tmp_path: Path,
    url: str,
    agent: Path,
    capsys: pytest.CaptureFixture[str],
    *extra: str,
) -> tuple[int, dict[str, Any]]:
    code = main(
        [
            "bench", "run", SET, "--agent", str(agent), "--store", url,
            "--studio", str(tree / "studio"), "--bench", str(tree / "bench"),
            "--runs", str(tmp_path / "runs"), "--json", *NOP, *extra,
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    sys.stderr.write(captured.err)  # for the test to read, if it wants
    return code, (json.loads(captured.out) if captured.out.strip() else {})


def runs(url: str) -> list[RunRecord]:
    with mc.open(url) as s:
        return [s.get(o, RunRecord) for o in s.iter_ids() if s.kind(o) == "medomni.run"]


def test_answers_served_model_tokens_and_cost_are_recorded(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    reply = Reply(content=f"Here it is:\n```json\n{ANSWER}\n```", prompt_tokens=300,
                  completion_tokens=7, cost=0.0004)  # fmt: skip
    with standin(reply) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        code, report = run(tree, tmp_path, url, llm_config(tree, tmp_path), capsys)
        assert provider.count == N
    assert code == 0 and report["jobs"][0]["outcomes"] == {"answered": N}
    recorded = runs(url)
    assert len(recorded) == N
    assert {(r.served_model, r.tokens_in, r.tokens_out, r.cost_usd) for r in recorded} == {
        (MODEL, 300, 7, 0.0004)
    }
    # the agent asked for the config's model, with the instruction and evidence
    body = provider.bodies[0]
    assert body["model"] == MODEL and "CKD" in body["messages"][1]["content"]
    assert "labs.jsonl" in body["messages"][1]["content"]
    assert provider.authorizations[0] == f"Bearer {KEY}"
    lines = [json.loads(x) for x in (Path(report["jobs"][0]["folder"]) / "runs.jsonl").open()]
    assert {
        (x["record"]["served_model"], x["record"]["tokens_in"], x["record"]["cost_usd"])
        for x in lines
    } == {(MODEL, 300, 0.0004)}


def test_another_served_model_is_an_error_naming_both(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with standin(Reply(content=ANSWER, model="cheaper-model-q4")) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        code, report = run(
            tree, tmp_path, url, llm_config(tree, tmp_path), capsys, "--fail-fast", "0"
        )
    assert code == 1 and report["jobs"][0]["outcomes"] == {"agent-failed": N}
    for r in runs(url):
        assert not r.predictions and r.served_model == "cheaper-model-q4"
        assert "'cheaper-model-q4'" in r.errors[-1] and f"'{MODEL}'" in r.errors[-1]


def test_usage_past_the_token_or_cost_limit_is_over_limit(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # odd requests use too many tokens, even ones cost too much
    def script(n: int, _body: dict[str, Any]) -> Reply:
        if n % 2:
            return Reply(content=ANSWER, prompt_tokens=50_000, completion_tokens=10)
        return Reply(content=ANSWER, cost=2.5)

    limits = {"time_sec": 120, "tokens": 20_000, "cost_usd": 0.10}
    with standin(script) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        agent = llm_config(tree, tmp_path, limits=limits)
        code, report = run(tree, tmp_path, url, agent, capsys, "--fail-fast", "0")
    assert code == 1 and report["jobs"][0]["outcomes"] == {"over-limit": N}
    errors = sorted(r.errors[-1] for r in runs(url))
    assert sum("50010 tokens, the limit is 20000" in e for e in errors) == N // 2
    assert sum("$2.5, the limit is $0.1" in e for e in errors) == N // 2


def test_a_run_past_its_time_limit_is_timeout(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # the first request hangs past the time limit (the client would wait longer); then answers
    script = lambda n, _b: Reply(content=ANSWER, hang=600 if n == 0 else 0)  # noqa: E731
    with standin(script) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        # long enough for an agent's start under a loaded test machine (about 3 s), short
        # enough not to cost the suite half a minute
        agent = llm_config(tree, tmp_path, limits={"time_sec": 12})
        code, report = run(tree, tmp_path, url, agent, capsys)
    assert code == 1 and report["jobs"][0]["outcomes"] == {"answered": N - 1, "timeout": 1}
    (late,) = [r for r in runs(url) if r.outcome == "timeout"]
    assert "no answer within 12 s" in late.errors[0]


def test_5xx_and_timeouts_are_infra_errors_kept_and_rerun_on_resume(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """marin-community/marin#7789, scaled down: of N slots 2 hit a 504 and 1 a client
    time-out; the other answers are kept, and resuming runs only the 3."""
    faults = {1: Reply(status=504), 4: Reply(status=504), 6: Reply(hang=10)}
    with standin(lambda n, _b: faults.get(n, Reply(content=ANSWER))) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        # the agent gives up after 1 s; the harness's relay counts no answer in 2 s a fault
        agent = llm_config(tree, tmp_path, args=["--timeout", "1"], endpoint_timeout_sec=2)
        code, report = run(tree, tmp_path, url, agent, capsys)
        assert provider.count == N  # no retry inside the agent: one request a run
        (job,) = report["jobs"]
        assert code == 1 and job["infra_errors"] == 3
        assert job["outcomes"] == {"answered": N - 3, "infra-error": 3}
        failed = [r for r in runs(url) if r.outcome == "infra-error"]
        assert sorted(e.errors[0].split(":")[1].strip() for e in failed) == [
            "the endpoint answered 504",
            "the endpoint answered 504",
            "the endpoint did not answer",
        ]

        code, report = run(tree, tmp_path, url, agent, capsys)
        assert provider.count == N + 3  # only the three ran again
    (job,) = report["jobs"]
    assert code == 0 and job["ran"] == 3 and job["done"] == N - 3
    assert job["outcomes"] == {"answered": N}
    recorded = runs(url)
    assert len(recorded) == N + 3  # the failed attempts stay, linked from the next
    again = [r for r in recorded if r.attempt == 2]
    assert {r.slot for r in again} == {r.slot for r in failed}
    assert all(r.previous is not None for r in again)


CLAIMS = """
    import json, os, pathlib, sys, urllib.request
    print("endpoint", os.environ["OPENAI_BASE_URL"])
    if sys.argv[1] == "answers":  # asks the model, writes its answer, and still claims
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps({"model": "m", "messages": []}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()
        pathlib.Path(os.environ["MEDOMNI_SUBMISSION"]).write_text('{"ckd_stage": "G2"}')
    why = "the endpoint answered 504"  # it did not
    pathlib.Path(os.environ["MEDOMNI_RUN_INFO"]).write_text(json.dumps({"infra_error": why}))
    sys.exit(3 if sys.argv[1] == "silent" else 0)
"""


@pytest.mark.parametrize("how", ["silent", "answers"])
def test_an_agents_infra_error_claim_counts_only_when_the_harness_saw_it(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:  # fmt: skip
    """A hostile agent says its endpoint failed, to be run again instead of scored: one that
    sent nothing, one whose request went through. The relay saw no fault, so each run stands
    as it ended (agent-failed; answered and scored), the claim is kept in its errors, and
    resume runs nothing again."""
    script = tmp_path / "claims.py"
    script.write_text(textwrap.dedent(CLAIMS))
    with standin(Reply(content=ANSWER)) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        agent = llm_config(tree, tmp_path, "claims", command=["python", str(script), how])
        code, report = run(tree, tmp_path, url, agent, capsys, "--fail-fast", "0")
        assert provider.count == (N if how == "answers" else 0)
        (job,) = report["jobs"]
        want = {"agent-failed": N} if how == "silent" else {"answered": N}
        assert job["outcomes"] == want and job["infra_errors"] == 0
        assert code == (1 if how == "silent" else 0)
        for r in runs(url):
            assert "the harness saw no fault of the endpoint" in r.errors[-1], r.errors
            assert "the endpoint answered 504" in r.errors[-1]
        assert all(r.predictions for r in runs(url)) == (how == "answers")
        # the agent was given the harness's relay, never the endpoint itself
        out = (next(Path(job["folder"]).glob("trials/*/stdout.txt"))).read_text()
        assert "/t/" in out and provider.base_url not in out
        code, report = run(tree, tmp_path, url, agent, capsys, "--fail-fast", "0")
        assert report["jobs"][0]["ran"] == 0 and len(runs(url)) == N


def test_the_relay_refuses_a_request_without_a_live_trials_token(tree: Path) -> None:
    import urllib.error
    import urllib.request

    from medomni_cas.bench.endpoint_relay import EndpointRelay
    from medomni_cas.bench.perception import serve

    with standin(Reply(content=ANSWER)) as provider:
        relay = EndpointRelay(provider.base_url, timeout=5)
        with serve(relay, host="127.0.0.1", port=0) as base:
            token = relay.issue()
            ok = urllib.request.urlopen(relay.url(base, token) + "/models", timeout=30)
            assert ok.status == 200 and json.loads(ok.read())["data"]
            relay.revoke(token)
            for bad in (relay.url(base, token), f"{base}/v1", relay.url(base, "0" * 32)):
                with pytest.raises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(bad + "/models", timeout=30)
                assert e.value.code in (401, 403)
            assert relay.refused == 3 and [c.outcome for c in relay.calls(token)] == ["200"]
        assert provider.count == 0  # /models is not a chat request: the stand-in counts those


def test_a_malformed_reply_is_the_agents_failure(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with standin(Reply(raw=b'{"id": "x", "choices": [')) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        # one trial at a time: at --concurrency 2 a sixth trial may be in flight (and ended,
        # unrecorded) when the fifth failure stops the job
        code, report = run(
            tree, tmp_path, url, llm_config(tree, tmp_path), capsys, "--concurrency", "1"
        )
        assert provider.count == 5  # five alike: fail-fast stopped the job
    (job,) = report["jobs"]
    assert (
        code == 1 and job["outcomes"] == {"agent-failed": 5} and "JSONDecodeError" in job["stopped"]
    )
    # the agent's own outcome: final, not run again
    with standin(Reply(content=ANSWER)) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        code, report = run(tree, tmp_path, url, llm_config(tree, tmp_path), capsys)
    assert report["jobs"][0]["done"] == 5 and report["jobs"][0]["ran"] == N - 5


def test_the_endpoint_and_key_reach_the_agent_only_when_the_config_names_them(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with standin(Reply(content=ANSWER)) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        # set here, but not named: the openai client finds no key (and would find no
        # endpoint), so it stops before any request
        agent = llm_config(tree, tmp_path, "bare", env=[], secrets=[], endpoint_env="")
        code, report = run(tree, tmp_path, url, agent, capsys)
        assert code == 1 and provider.count == 0
        assert "OPENAI_API_KEY" in report["jobs"][0]["stopped"]


def test_a_named_variable_that_is_not_set_fails_the_check(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = run(tree, tmp_path, url, llm_config(tree, tmp_path), capsys)
    assert code == 1
    # the route check, before the runner's, finds the endpoint's variable not set
    assert report["error"]["problems"] == [
        "route: agent config llm: settings.endpoint_env names OPENAI_BASE_URL, which is not set"
    ]
    # a variable only passed to the agent is the runner's check
    code, report = run(tree, tmp_path, url, llm_config(tree, tmp_path, endpoint_env=""), capsys)
    assert code == 1 and any(
        "settings.env names OPENAI_BASE_URL, which is not set" in p
        for p in report["error"]["problems"]
    )
    assert runs(url) == []
