"""Route checks before anything runs: a local route's endpoint must be local as resolved now;
a dataset's policy refuses a route it denies and prints the conditions of one it allows on
conditions. Each through ``medomni bench run``; nothing runs when a check fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from medomni_cas.bench.routes import resolve_endpoint
from tests.test_llm_agent import KEY, llm_config, llm_tree, run, runs


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_tree(tmp_path_factory.mktemp("routes"), n=2)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://10.20.30.40/v1", True),
        ("https://192.168.1.5:4000", True),
        ("http://172.17.0.1:8000/v1", True),  # the Docker bridge's gateway
        ("unix:///run/llm.sock", True),
        ("http+unix://%2Frun%2Fllm.sock/v1", True),
        ("http://8.8.8.8/v1", False),
        ("https://[2001:4860:4860::8888]/v1", False),
        ("http://[::ffff:8.8.4.4]/v1", False),
    ],
)
def test_local_is_loopback_private_or_a_unix_socket(url: str, local: bool) -> None:
    endpoint = resolve_endpoint(url)
    assert not endpoint.problem and endpoint.local is local


def test_an_endpoint_that_does_not_resolve_or_is_no_url_is_a_problem() -> None:
    assert "does not resolve" in resolve_endpoint("http://no-such-host.invalid/v1").problem
    assert "not an http(s) URL" in resolve_endpoint("ftp://127.0.0.1/").problem


def test_a_local_route_to_a_public_address_is_refused_naming_the_host(
    tree: Path,
    tmp_path: Path,
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://8.8.8.8:443/v1")
    code, report = run(tree, tmp_path, url, llm_config(tree, tmp_path), capsys)
    assert code == 1 and runs(url) == []
    (problem,) = report["error"]["problems"]
    assert "endpoint host 8.8.8.8 (OPENAI_BASE_URL) resolves to 8.8.8.8" in problem
    assert "use route: cloud" in problem

    # the same endpoint on the cloud route is the cloud route's business (the policy)
    cloud = llm_config(tree, tmp_path, "hosted")
    cloud.write_text(cloud.read_text().replace("route: local", "route: cloud"))
    code, report = run(tree, tmp_path, url, cloud, capsys)
    assert code == 1 and runs(url) == []
    (problem,) = report["error"]["problems"]
    assert "allows the cloud route only if: Synthetic data may go" in problem


def _cloud_baseline(tree: Path, tmp_path: Path) -> Path:
    doc = yaml.safe_load((tree / "bench/agents/baseline.yaml").read_text())
    doc.update(agent="cloud-baseline", route="cloud")
    path = tmp_path / "cloud-baseline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_conditional_route_prints_its_conditions(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = _cloud_baseline(tree, tmp_path)
    code, report = run(tree, tmp_path, url, agent, capsys)
    assert code == 1 and runs(url) == []
    assert "forbids training on the prompts" in report["error"]["problems"][0]
    code, _ = run(tree, tmp_path, url, agent, capsys, "--accept-conditions")
    assert code == 0 and len(runs(url)) == 2
    assert "cloud route: you accepted: Synthetic data may go" in capsys.readouterr().err


def test_a_credentialed_dataset_denying_cloud_refuses_a_cloud_config(
    tree: Path, tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tree / "studio/datasets/synth-ehr/dataset.yaml"
    before = dataset.read_text()
    doc = yaml.safe_load(before)
    doc["credentialed"] = True
    doc["routes"]["cloud"] = {"policy": "deny"}
    dataset.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        agent = _cloud_baseline(tree, tmp_path)
        code, report = run(tree, tmp_path, url, agent, capsys, "--accept-conditions")
    finally:
        dataset.write_text(before)
    assert code == 1 and runs(url) == []
    assert report["error"]["problems"] == ["route: dataset synth-ehr denies the cloud route"]
