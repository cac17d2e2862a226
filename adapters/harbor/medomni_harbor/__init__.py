"""medomni-harbor: the Harbor runner plug-in.

Atom tasks rendered as Harbor task folders, run by Harbor (``harbor.job.Job``) in Docker
containers with no network but the perception relay, and collected into the harness's
`Trial`s. Registered as runner ``harbor`` in ``medomni.runners``.

Importing this package makes Harbor offline: LiteLLM's bundled cost map instead of a download
(``LITELLM_LOCAL_MODEL_COST_MAP``) and Harbor's telemetry off (``HARBOR_TELEMETRY=0``), unless
you set either yourself.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HARBOR_TELEMETRY", "0")

__version__ = "0.1.0"
__all__ = ["__version__"]
