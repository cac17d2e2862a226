"""Images: the agent's (``local/base:1`` by default, ``local/terminus:1`` for terminus-2) and
the perception sidecar's.

No registry is reachable, so the perception image is built here, ``FROM`` the base image, by
the engine's legacy builder with no network. It holds no Python: the sidecar runs *this
machine's* interpreter and packages, bind-mounted read-only at the paths they have here (the
interpreter's prefix, the virtual environment, editable source folders, and the C libraries in
``/usr/lib``). That keeps the image a few MB, which matters with the ``vfs`` storage driver
(every container is a full copy of its image), and needs nothing downloaded.

What the sidecar serves is pinned anyway: the image's tag and labels are derived from the
interpreter, ``medomni-cas``'s version and every encoder's name, version and digest, so a new
encoder (or a new version of one) is a new image, and a run records the image id with each
encoder it served. The trade-off, documented in the README: the image runs only on an engine
that shares this machine's file system (a local engine), and the code it runs is the code
installed here, identified by version and digest rather than sealed into the image.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import blake3

from medomni_harbor import _docker

__all__ = [
    "AGENT_IMAGE",
    "PERCEPTION_REPO",
    "RUNTIME_LABEL",
    "TERMINUS_IMAGE",
    "build_perception_image",
    "ensure_perception_image",
    "perception_tag",
    "runtime",
]

AGENT_IMAGE = "local/base:1"
#: the base image and tmux, which terminus-2 drives (`.ci/docker-engine image` imports both)
TERMINUS_IMAGE = "local/terminus:1"
PERCEPTION_REPO = "local/medomni-perception"
RUNTIME_LABEL = "medomni.perception.runtime"
ENCODERS_LABEL = "medomni.perception.encoders"
_LIBS = ("/usr/lib", "/usr/lib64")


def _cover(paths: list[str]) -> list[str]:
    """The fewest folders that contain every path (a folder inside another is dropped)."""
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths} | set(paths), key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return sorted(out)


def _editable_roots() -> list[str]:
    """Folders the environment's ``.pth`` files add (editable installs), and where
    ``medomni_cas`` itself is: stable however Python was started (unlike ``sys.path``)."""
    import site

    import medomni_cas

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(medomni_cas.__file__)))]
    for sp in site.getsitepackages():
        for pth in sorted(Path(sp).glob("*.pth")):
            for line in pth.read_text(errors="replace").splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import ")) and os.path.isdir(line):
                    roots.append(line)
    return roots


def runtime() -> dict[str, Any]:
    """What the sidecar needs of this machine: the interpreter and the folders to mount."""
    roots = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    roots += _editable_roots()
    mounts = _cover([p for p in roots if not p.startswith(_LIBS)])
    mounts += [p for p in _LIBS if os.path.isdir(p)]
    return {
        "python": sys.executable,
        "version": sys.version.split()[0],
        "mounts": sorted(dict.fromkeys(mounts)),
    }


def _encoders() -> list[dict[str, str]]:
    from medomni_cas.bench.encoders import encoders

    return [
        {"name": n, "version": e.version, "digest": e.digest} for n, e in sorted(encoders().items())
    ]


def _identity(base_id: str) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "base": base_id,
        "runtime": runtime(),
        "medomni_cas": version("medomni-cas"),
        "encoders": _encoders(),
    }


def perception_tag(host: str | None = None, base: str = AGENT_IMAGE) -> str:
    """``local/medomni-perception:<16 hex>`` for this machine's runtime and encoders."""
    base_id = _docker.client(host).images.get(base).id
    ident = json.dumps(_identity(base_id), sort_keys=True).encode()
    return f"{PERCEPTION_REPO}:{blake3.blake3(ident).hexdigest()[:16]}"


_DOCKERFILE = """\
FROM {base}
RUN mkdir -p /evidence /perception /usr/lib /usr/lib64 \\
 && {{ [ -e /lib ] || ln -s usr/lib /lib; }} && {{ [ -e /lib64 ] || ln -s usr/lib64 /lib64; }}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
"""


def build_perception_image(host: str | None = None, base: str = AGENT_IMAGE) -> Any:
    """Build the perception image for this machine (no network, no registry); its image."""
    c = _docker.client(host)
    base_id = c.images.get(base).id
    ident = _identity(base_id)
    tag = perception_tag(host, base)
    image, _logs = c.images.build(
        fileobj=io.BytesIO(_DOCKERFILE.format(base=base).encode()),
        tag=tag,
        rm=True,
        forcerm=True,
        network_mode="none",
        labels={
            RUNTIME_LABEL: json.dumps(ident["runtime"], sort_keys=True),
            ENCODERS_LABEL: json.dumps(ident["encoders"], sort_keys=True),
            "medomni.perception.medomni-cas": ident["medomni_cas"],
        },
    )
    return image


def ensure_perception_image(host: str | None = None, base: str = AGENT_IMAGE) -> Any:
    """The perception image for this machine, built if the engine does not have it."""
    import docker

    c = _docker.client(host)
    try:
        return c.images.get(perception_tag(host, base))
    except docker.errors.ImageNotFound:
        return build_perception_image(host, base)


def sidecar_runtime(image: Any) -> dict[str, Any]:
    """The interpreter and mounts recorded in a perception image's label."""
    raw = (image.labels or {}).get(RUNTIME_LABEL)
    if not raw:
        raise ValueError(f"image {image.tags or image.id} is not a medomni perception image")
    data: dict[str, Any] = json.loads(raw)
    missing = [m for m in data["mounts"] if not Path(m).exists()]
    if missing:
        raise ValueError(
            f"perception image {image.tags or image.id} mounts {missing[0]}, which is not on "
            "this machine: rebuild it here (`python -m medomni_harbor images`)"
        )
    return data
