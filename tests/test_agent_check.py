"""``medomni bench agent check``: every field with its meaning, the route, one tiny request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from medomni_cas.cli.main import main
from tests.llm_provider import Reply, standin
from tests.test_llm_agent import KEY, MODEL

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples/bench/agents/llm-local.yaml"


def _config(tmp_path: Path, **top: object) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["model"] = doc["settings"]["served_model"] = MODEL
    doc.update(top)
    path = tmp_path / "llm-local.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def _check(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["bench", "agent", "check", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_good_config_lists_every_field_and_what_the_endpoint_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with standin(Reply(content="OK", prompt_tokens=14, completion_tokens=1, cost=1e-05)) as p:
        monkeypatch.setenv("OPENAI_BASE_URL", p.base_url)
        code, out = _check(_config(tmp_path), capsys)
        assert p.count == 1 and p.authorizations == [f"Bearer {KEY}"]
        assert p.bodies[0]["model"] == MODEL and p.bodies[0]["max_tokens"] <= 16
    assert code == 0, out
    for name in (
        "kind", "agent", "model", "route", "settings.scaffold", "settings.served_model",
        "settings.limits.time_sec", "settings.limits.tokens", "settings.limits.cost_usd",
        "settings.env", "settings.endpoint_env", "settings.secrets", "settings.command",
    ):  # fmt: skip
        assert f"  {name} " in out
    assert "The model name the provider must report back" in out  # a meaning
    assert f"OPENAI_BASE_URL = {p.base_url}" in out
    assert "OPENAI_API_KEY (set, secret)" in out and KEY not in out
    assert "endpoint host 127.0.0.1: 127.0.0.1 (local; route local)" in out
    assert f"served model '{MODEL}' (config: '{MODEL}'), latency " in out
    assert "tokens 14 in / 1 out, $1e-05" in out and out.rstrip().endswith("ok")

    with standin(Reply(content="OK")) as p:
        monkeypatch.setenv("OPENAI_BASE_URL", p.base_url)
        code, out = _check(_config(tmp_path), capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["served_model"] == MODEL and doc["tokens_in"] == 20
    assert {f["name"] for f in doc["fields"]} >= {"settings.served_model", "settings.secrets"}


def test_another_served_model_fails_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with standin(Reply(content="OK", model="llama-3-8b-q4")) as p:
        monkeypatch.setenv("OPENAI_BASE_URL", p.base_url)
        code, out = _check(_config(tmp_path), capsys)
    assert code == 1
    assert f"PROBLEM: served model 'llama-3-8b-q4' is not the config's '{MODEL}'" in out


@pytest.mark.parametrize("fault", [Reply(status=503), Reply(raw=b"<html>gateway</html>")])
def test_a_failing_endpoint_fails(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fault: Reply,
) -> None:
    with standin(fault) as p:
        monkeypatch.setenv("OPENAI_BASE_URL", p.base_url)
        code, out = _check(_config(tmp_path), capsys)
    assert code == 1 and "PROBLEM: request: " in out


def test_a_public_endpoint_on_the_local_route_is_refused_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://user:pw@8.8.8.8/v1")
    code, out = _check(_config(tmp_path), capsys)
    assert code == 1 and "endpoint host 8.8.8.8 (OPENAI_BASE_URL) resolves to 8.8.8.8" in out
    assert "pw@" not in out and "[user hidden]@8.8.8.8" in out
    assert "latency" not in out  # nothing was sent


def test_unset_variables_and_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = _check(_config(tmp_path), capsys)
    assert code == 1 and "settings.env names OPENAI_BASE_URL, which is not set" in out
    assert "OPENAI_BASE_URL = (not set)" in out
    code, out = _check(_config(tmp_path, colour="red"), capsys)
    assert code == 2 and "colour" in out


def test_a_config_without_an_endpoint_sends_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _check(ROOT / "examples/bench/agents/baseline.yaml", capsys)
    assert code == 0 and "no endpoint named" in out and "runner: process" in out


@pytest.mark.parametrize("name", ["terminus-2-local", "terminus-2-cloud"])
def test_the_terminus_2_configs_check_against_an_openai_compatible_endpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    pytest.importorskip("medomni_harbor")
    config = ROOT / f"examples/bench/agents/{name}.yaml"
    doc = yaml.safe_load(config.read_text())
    served = doc["settings"]["served_model"]
    with standin(Reply(content="OK", model=served)) as p:
        monkeypatch.setenv("OPENAI_BASE_URL", p.base_url)
        code, out = _check(config, capsys)
        # LiteLLM's openai/ prefix is LiteLLM's: the server is asked for the name after it
        assert p.bodies[0]["model"] == doc["model"].removeprefix("openai/")
    assert code == 0, out
    assert "runner: harbor (for scaffold 'terminus-2')" in out
    assert f"served model '{served}'" in out
