"""The distribution a user installs: its metadata, and a wheel that works on its own.

The slow test builds the sdist and, from it, the wheel (``python -m build``), installs the
wheel with its ``notebook`` extra into a fresh venv (no system site-packages, the repo not on
any path), and, from a folder outside the repo holding a copy of ``examples/``, runs the
store, a Studio build of the example set, a run of the baseline agent (process runner) and a
notebook table. The ``bench`` extra is not installed, so the encoder arms must say so.

Installing takes the registry's time: ``uv`` (a dev dependency) when it is there, about 10 s
for the notebook extra, else pip, about 3 minutes. Both use a cache under the test's tmp
folder, so nothing is written outside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import medomni_cas

ROOT = Path(__file__).resolve().parents[1]
HARBOR = ROOT / "adapters/harbor"


def _pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def _requirements(specs: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(s)).name: r for s in specs}


def _version(init: Path) -> str:
    found = re.search(r'^__version__ = "([^"]+)"', init.read_text(), re.MULTILINE)
    assert found, init
    return found.group(1)


# -- metadata (fast) ----------------------------------------------------------------------------
def test_one_version_each_read_by_the_build() -> None:
    for folder, init in ((ROOT, "medomni_cas/__init__.py"), (HARBOR, "medomni_harbor/__init__.py")):
        project = _pyproject(folder)
        assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
        assert project["tool"]["hatch"]["version"]["path"] == init
        assert (folder / project["project"]["license-files"][0]).is_file()
    assert _version(ROOT / "medomni_cas/__init__.py") == medomni_cas.__version__


def test_the_core_does_not_pull_the_extras() -> None:
    project = _pyproject(ROOT)["project"]
    core = _requirements(project["dependencies"])
    extras = project["optional-dependencies"]
    for extra, names in {
        "notebook": {"pandas", "ipywidgets"},
        "bench": {"starlette", "uvicorn", "httpx"},
        "view": {"starlette", "uvicorn"},
        "s3": {"s3fs"},
        "compare": {"scipy", "matplotlib"},
        "attest": {"cryptography"},
        "harbor": {"medomni-harbor"},
    }.items():
        assert set(_requirements(extras[extra])) == names, extra
        assert not names & set(core), extra
    dev = _requirements(extras["dev"])
    assert dev["medomni-cas"].extras == {
        "notebook",
        "bench",
        "view",
        "s3",
        "compare",
        "attest",
        "docs",
    }
    assert {"pytest", "mypy", "build", "jsonschema"} <= set(dev)
    assert set(_requirements(extras["docs"])) == {"mkdocs", "mkdocs-material"}


def test_the_harbor_adapter_pins_agree_with_the_core() -> None:
    core = _pyproject(ROOT)["project"]
    adapter = _pyproject(HARBOR)["project"]
    wants = _requirements(adapter["dependencies"])
    # each names the other's current version range; the sidecar serves the gateway
    assert wants["medomni-cas"].specifier.contains(medomni_cas.__version__)
    assert wants["medomni-cas"].extras == {"bench"}
    named = _requirements(core["optional-dependencies"]["harbor"])["medomni-harbor"]
    assert named.specifier.contains(_version(HARBOR / "medomni_harbor/__init__.py"))
    assert str(wants["docker"].specifier) == str(
        _requirements(core["optional-dependencies"]["dev"])["docker"].specifier
    )
    assert "toml" not in wants and "tomli-w" in wants


# -- the installed wheel (slow) -----------------------------------------------------------------
_DRIVE = """
import importlib.metadata, json, subprocess, sys
from pathlib import Path

import medomni_cas as mc
from medomni_cas._extras import MissingExtra

SET = "medomni-bench/v1"
here = Path.cwd()
out = {"file": mc.__file__, "path": sys.path, "version": mc.__version__,
       "dist_version": importlib.metadata.version("medomni-cas")}

# the store on its own
class Note(mc.Record, kw_only=True):
    __kind__ = "wheel-note"
    text: str
    attachment: mc.ObjectId | None = None

store = mc.open(f"lmdb://{here / 'notes'}")
blob = store.put_blob(b"attached")
note = store.put(Note(text="hello", attachment=blob))
assert store.get(note, Note).text == "hello" and store.read_blob(blob) == b"attached"
assert set(store.closure(note)) == {note, blob}
store.close()

# the example's data, made by the copy of examples/ (as `make demo` makes it)
from examples import synth
synth.generate(here / "examples/studio/datasets/synth-ehr/data", patients=100, seed=0)

ws = mc.open_workspace("examples")
view = ws.build(SET, progress=False)
out["arms"] = sorted({e.arm for e in view.entries})
# a slice of the set's slots: the baseline's runs are what is checked, not their number
report = ws.run(SET, "baseline", arms=["no-perception"], progress=False, shard=(0, 10))
out["ran"] = [j.ran for j in report.jobs]
out["infra"] = [j.infra_errors for j in report.jobs]
df = ws.runs_df(SET)
out["df"] = [type(df).__module__, len(df), sorted(set(df["outcome"])), sorted(set(df["arm"]))]
try:
    ws.run(SET, "baseline", arms=["encoders"], progress=False, shard=(0, 10))
except MissingExtra as e:
    out["encoders"] = str(e)
out["cli"] = subprocess.run(
    [str(Path(sys.executable).parent / "medomni"), "--version"], capture_output=True, text=True
).stdout.strip()
print("RESULT " + json.dumps(out))
"""


def _clean_env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env.update(UV_CACHE_DIR=str(tmp / "cache/uv"), PIP_CACHE_DIR=str(tmp / "cache/pip"))
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _uv() -> str | None:
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    return find_uv_bin()


@pytest.mark.slow
def test_the_wheel_works_on_its_own(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    dist = tmp_path / "dist"
    uv = _uv()
    build = [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)]
    if uv is not None:
        build += ["--installer", "uv"]
        env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"
    _run(build, tmp_path, env)  # the sdist, then the wheel from it
    (sdist,) = dist.glob("medomni_cas-*.tar.gz")
    (wheel,) = dist.glob("medomni_cas-*.whl")
    assert wheel.name == f"medomni_cas-{medomni_cas.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"medomni_cas-{medomni_cas.__version__}.dist-info/METADATA").decode()
    assert f"medomni_cas-{medomni_cas.__version__}.dist-info/licenses/LICENSE" in names
    assert "medomni_cas/bench/baseline.py" in names
    assert "medomni_cas/py.typed" in names  # PEP 561: checkers read the package's own types
    assert "Classifier: Typing :: Typed" in meta
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    # starlette only with the bench extra, pandas only with notebook
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any(
        r.startswith("Requires-Dist: starlette") and "extra == 'bench'" in r for r in requires
    )
    assert all("extra ==" in r for r in requires if re.search(r"(starlette|uvicorn|pandas)", r))

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin/python"
    target = f"{wheel}[notebook]"
    if uv is not None:
        _run([uv, "pip", "install", "--quiet", "--python", str(python), target], tmp_path, env)
    else:
        pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", target]
        _run(pip, tmp_path, env)

    work = tmp_path / "work"
    work.mkdir()
    skip = shutil.ignore_patterns("data", "out", "runs", ".medomni", "__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "examples", work / "examples", ignore=skip)
    (work / "drive.py").write_text(_DRIVE)
    stdout = _run(
        [str(python), "drive.py"], work, env
    )  # as a user runs a script: its folder on sys.path
    result = json.loads(stdout.split("RESULT ", 1)[1])

    site = str(venv / "lib")
    assert result["file"].startswith(site)
    assert not any(p.startswith(str(ROOT)) for p in result["path"])
    assert result["version"] == result["dist_version"] == medomni_cas.__version__
    assert result["cli"] == f"medomni {medomni_cas.__version__}"
    assert result["arms"] == ["encoders", "encoders-required", "modality-ladder", "no-perception"]
    assert result["ran"] and all(result["ran"]) and result["infra"] == [0]
    kind, rows, outcomes, arms = result["df"]
    assert kind.startswith("pandas") and rows == sum(result["ran"])
    assert outcomes == ["answered"] and arms == ["no-perception"]
    assert result["encoders"].endswith("pip install 'medomni-cas[bench]'")
    assert sdist.stat().st_size > 0
