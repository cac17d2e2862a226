"""Optional dependencies: the core imports without them, and a missing one names its extra.

An install without an extra is made real in a subprocess whose import system refuses the
extra's modules (a meta path finder raising ModuleNotFoundError, as a missing package does);
the wheel test (test_wheel.py) checks the same on a real install without the ``bench`` extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from medomni_cas._extras import MissingExtra, require
from medomni_cas.errors import MedomniError

ROOT = Path(__file__).resolve().parents[1]

# Refuses the named top-level packages, as an environment without them would.
_BLOCK = """
import sys
BLOCKED = {blocked!r}
class _Missing:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Missing)
"""


def _python(code: str, blocked: set[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = _BLOCK.format(blocked=sorted(blocked)) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


def test_require_returns_the_module() -> None:
    import json

    assert require("json", "notebook") is json
    assert require("os.path", "notebook").join("a", "b") == "a/b"


def test_a_missing_module_names_its_extra() -> None:
    with pytest.raises(MissingExtra) as info:
        require("medomni_no_such_module.tables", "notebook", "notebook tables")
    e = info.value
    assert isinstance(e, MedomniError) and isinstance(e, ModuleNotFoundError)
    assert (e.module, e.extra, e.name) == ("medomni_no_such_module.tables", "notebook", e.module)
    assert str(e) == (
        "medomni_no_such_module.tables is not installed (needed for notebook tables): "
        "pip install 'medomni-cas[notebook]'"
    )


def test_a_module_missing_one_of_its_own_imports_is_not_an_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # installing the extra again would not fix a module that is there but broken
    (tmp_path / "medomni_broken_mod.py").write_text("import medomni_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        require("medomni_broken_mod", "bench")
    assert not isinstance(info.value, MissingExtra)
    assert info.value.name == "medomni_absent_dependency"


def test_the_core_imports_without_the_web_stack_or_pandas(tmp_path: Path) -> None:
    code = """
    import medomni_cas as mc
    import medomni_cas.bench.harness, medomni_cas.bench.perception, medomni_cas.bench.process
    import medomni_cas.cli.main, medomni_cas.studio.tasksets, medomni_cas.audit.verify
    from medomni_cas.cli.main import build_parser
    build_parser()
    store = mc.open("memory://")
    assert store.read_blob(store.put_blob(b"x")) == b"x"
    leaked = sorted(m for m in ("starlette", "uvicorn", "pandas", "ipywidgets") if m in sys.modules)
    print("leaked:", leaked)
    assert not leaked, leaked
    """
    out = _python(code, {"starlette", "uvicorn", "pandas", "ipywidgets"}, tmp_path)
    assert out.returncode == 0, out.stderr


def test_a_gateway_without_the_bench_extra_says_what_to_install(tmp_path: Path) -> None:
    code = """
    from medomni_cas._extras import MissingExtra
    from medomni_cas.bench.perception import Gateway, main
    try:
        Gateway(".", ["ecg"], budget=1)
    except MissingExtra as e:
        print("gateway:", e)
    try:
        main(["--evidence", ".", "--families", "ecg", "--budget", "1"])
    except MissingExtra as e:
        print("sidecar:", e)
    """
    out = _python(code, {"starlette", "uvicorn"}, tmp_path)
    assert out.returncode == 0, out.stderr
    want = (
        "starlette is not installed (needed for the perception gateway): "
        "pip install 'medomni-cas[bench]'"
    )
    assert out.stdout.splitlines() == [f"gateway: {want}", f"sidecar: {want}"]


def test_the_gateway_needs_uvicorn_too(tmp_path: Path) -> None:
    code = """
    from medomni_cas.bench.perception import Gateway
    Gateway(".", ["ecg"], budget=1)
    """
    out = _python(code, {"uvicorn"}, tmp_path)
    assert out.returncode == 1
    assert "uvicorn is not installed" in out.stderr and "medomni-cas[bench]" in out.stderr


def test_the_endpoint_relay_without_the_bench_extra_fails_the_check(tmp_path: Path) -> None:
    """The process runner relays a config's model endpoint (medomni_cas.bench.endpoint_relay):
    without httpx, the check says what to install, before anything runs."""
    code = f"""
    import os, types
    from medomni_cas.bench.agents import load_agent
    from medomni_cas.bench.process import _relay_problems
    os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"
    agent = load_agent({str(ROOT / "examples/bench/agents/llm-local.yaml")!r})
    print(_relay_problems(types.SimpleNamespace(agent=agent)))
    """
    out = _python(code, {"httpx"}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "httpx is not installed (needed for the process runner's relay" in out.stdout
    assert "pip install 'medomni-cas[bench]'" in out.stdout
