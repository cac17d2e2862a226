"""Images: the agent's (``local/base:1`` by default, ``local/terminus:1`` for terminus-2) and
the perception relay's.

No registry is reachable, so the relay image is built here, ``FROM`` the base image, by the
engine's legacy builder with no network: the base image and one static binary,
``/usr/bin/medomni-relay``, compiled from ``relay/relay.c`` with this machine's C compiler
(``gcc -static``). It holds no Python, no encoder and nothing of this machine's file system:
it runs on any engine, local or remote. The relay only moves bytes between the trial's
loopback and a unix socket (`medomni_harbor.gateway`); the encoders run in the job's gateway,
on the harness's side, so what they are is recorded by name, version and digest, as the
process runner records them.

The tag is derived from the base image and the relay's source, so a changed relay is a new
image.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import blake3

from medomni_harbor import _docker

__all__ = [
    "AGENT_IMAGE",
    "RELAY_BINARY",
    "RELAY_REPO",
    "RELAY_SOURCE",
    "TERMINUS_IMAGE",
    "build_relay_image",
    "compile_relay",
    "ensure_relay_image",
    "relay_tag",
]

AGENT_IMAGE = "local/base:1"
#: the base image and tmux, which terminus-2 drives (`.ci/docker-engine image` imports both)
TERMINUS_IMAGE = "local/terminus:1"
RELAY_REPO = "local/medomni-relay"
RELAY_SOURCE = Path(__file__).resolve().parent / "relay" / "relay.c"
#: where the binary is in the image
RELAY_BINARY = "/usr/bin/medomni-relay"
SOURCE_LABEL = "medomni.relay.source"

_DOCKERFILE = """\
FROM {base}
COPY medomni-relay /usr/bin/medomni-relay
RUN mkdir -p /relay
"""


def relay_tag(host: str | None = None, base: str = AGENT_IMAGE) -> str:
    """``local/medomni-relay:<16 hex>`` for the base image and the relay's source."""
    base_id = _docker.client(host).images.get(base).id
    h = blake3.blake3(base_id.encode() + b"\0" + RELAY_SOURCE.read_bytes())
    return f"{RELAY_REPO}:{h.hexdigest()[:16]}"


def compile_relay(out: Path) -> Path:
    """The relay as a static binary at ``out`` (``gcc -static -Os``), or OSError saying why."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise OSError(
            "no C compiler to build the perception relay: install gcc and libc6-dev "
            "(`bash .ci/docker-engine install` does)"
        )
    argv = [cc, "-static", "-Os", "-s", "-o", str(out), str(RELAY_SOURCE)]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")
    return out


def build_relay_image(host: str | None = None, base: str = AGENT_IMAGE) -> Any:
    """Build the relay image (no network, no registry); its image."""
    c = _docker.client(host)
    tag = relay_tag(host, base)
    with tempfile.TemporaryDirectory(prefix="medomni-relay-") as tmp:
        binary = compile_relay(Path(tmp) / "medomni-relay")
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            dockerfile = _DOCKERFILE.format(base=base).encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile)
            tar.addfile(info, io.BytesIO(dockerfile))
            info = tar.gettarinfo(str(binary), arcname="medomni-relay")
            info.uid = info.gid = 0
            info.mode = 0o755
            with binary.open("rb") as f:
                tar.addfile(info, f)
        context.seek(0)
        image, _logs = c.images.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            network_mode="none",
            labels={SOURCE_LABEL: blake3.blake3(RELAY_SOURCE.read_bytes()).hexdigest()},
        )
    return image


def ensure_relay_image(host: str | None = None, base: str = AGENT_IMAGE) -> Any:
    """The relay image, built if the engine does not have it."""
    import docker

    c = _docker.client(host)
    try:
        return c.images.get(relay_tag(host, base))
    except docker.errors.ImageNotFound:
        return build_relay_image(host, base)
