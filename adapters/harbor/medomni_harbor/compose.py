"""The closed network and the perception relay as a task's ``environment/docker-compose.yaml``.

For Harbor's compose-based environments (its ``docker`` environment through ``docker
compose`` v2, GKE's compose mode in a Docker-in-Docker pod, ...), which run a task's own
compose file. A task rendered for them (`medomni_harbor.render`, ``compose=True``) holds::

    environment/
      Dockerfile            FROM <agent image>, COPY workspace/ /workspace/
      workspace/            the staged files every runner stages
      docker-compose.yaml   the services below

and, on arms that attach the service, three services per trial::

    perception     the relay image: `medomni-relay relay 8899 /relay/gateway.sock <token>`,
                   network_mode none (only lo), the volume `relay` read-only
    gateway-link   the relay image: `medomni-relay forward /relay/gateway.sock <host> <port>`,
                   network_mode host (it reaches the job's gateway), the volume `relay`
    main           the agent's container: network_mode "service:perception", so it has only
                   the relay's lo, where http://perception:8899 answers

On arms without the service, ``main`` alone with network_mode none. The compose file, not
Harbor, closes the network: the task declares ``network_mode = "public"`` to Harbor, whose
own no-network enforcement would either need its egress sidecar image from a registry
(``docker``) or replace main's network_mode with ``none`` (GKE's no-network overlay), cutting
main off from the relay. The token is written into the compose file when the job starts
(`write_perception`), and only the relay's command holds it: ``main``'s image copies
``workspace/`` alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from medomni_harbor.gateway import RELAY_MOUNT, RELAY_SOCKET

__all__ = [
    "COMPOSE_FILE",
    "WORKSPACE_DIR",
    "closed_main",
    "dockerfile",
    "perception_services",
    "write_closed",
    "write_perception",
]

COMPOSE_FILE = "docker-compose.yaml"
WORKSPACE_DIR = "workspace"  # under environment/: what main's image copies to /workspace
PORT = 8899


def dockerfile(image: str, workdir: str) -> str:
    """main's image: the agent image and the staged files, nothing else of the task."""
    return f"FROM {image}\nCOPY {WORKSPACE_DIR}/ {workdir}/\nWORKDIR {workdir}\n"


def closed_main() -> dict[str, Any]:
    """main alone, with no network at all (arms without the perception service)."""
    return {"services": {"main": {"network_mode": "none"}}}


def perception_services(relay_image: str, token: str, host: str, port: int) -> dict[str, Any]:
    """The relay, the forwarder and main in the relay's namespace (the module docstring)."""
    return {
        "services": {
            "perception": {
                "image": relay_image,
                "command": ["medomni-relay", "relay", str(PORT), RELAY_SOCKET, token],
                "network_mode": "none",
                "extra_hosts": ["perception:127.0.0.1"],
                "volumes": [f"relay:{RELAY_MOUNT}:ro"],
                "depends_on": ["gateway-link"],
            },
            "gateway-link": {
                "image": relay_image,
                "command": ["medomni-relay", "forward", RELAY_SOCKET, host, str(port)],
                "network_mode": "host",
                "volumes": [f"relay:{RELAY_MOUNT}"],
            },
            "main": {"network_mode": "service:perception", "depends_on": ["perception"]},
        },
        "volumes": {"relay": {}},
    }


def _write(task_dir: Path, doc: dict[str, Any]) -> Path:
    path = task_dir / "environment" / COMPOSE_FILE
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_closed(task_dir: Path) -> Path:
    return _write(task_dir, closed_main())


def write_perception(
    task_dir: Path, relay_image: str, token: str, address: tuple[str, int]
) -> Path:
    """The trial's compose file with its token and the gateway's address."""
    host, port = address
    return _write(task_dir, perception_services(relay_image, token, host, port))
