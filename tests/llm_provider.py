"""A stand-in model provider for tests: an OpenAI-compatible chat-completions server.

It stands in for the provider only: the agents, their client (the ``openai`` package) and the
harness run for real. Each test gives it a script, a function from the request's number
(0, 1, ...) and JSON body to the `Reply` it sends: the model name it reports, the ``usage``
tokens (and a cost, as OpenRouter's ``usage.cost`` and LiteLLM's ``x-litellm-response-cost``
header carry it), the content, or a fault (an HTTP status, a hang, a body that is not JSON).
It counts every request it receives, and keeps each body and Authorization header.

::

    with standin(lambda n, body: Reply(content='{"ckd_stage": "G2"}')) as provider:
        provider.base_url   # http://127.0.0.1:PORT/v1, for OPENAI_BASE_URL
        provider.count      # requests received so far

Served with uvicorn in a thread (`medomni_cas.bench.perception.serve`); ``host`` may be any
address of this machine (the Docker bridge's gateway, for a container to reach it).

`TerminusScript` is the script of a model driving Harbor's terminus-2, one behaviour per
trial (an answer, another served model, a 504, a hang, usage past the limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BEHAVIOURS",
    "DEFAULT_MODEL",
    "Provider",
    "Reply",
    "Script",
    "TerminusScript",
    "standin",
]

DEFAULT_MODEL = "stand-in-model"


@dataclass
class Reply:
    """What the stand-in answers to one request.

    ``model`` None reports the model the request asked for. ``status`` other than 200 sends
    an OpenAI-style error body with that status; ``hang`` waits that many seconds before
    answering (a hang past the client's timeout); ``raw`` is sent as the body as it is,
    with a JSON content type (a malformed body)."""

    content: str = ""
    model: str | None = None
    prompt_tokens: int = 20
    completion_tokens: int = 5
    cost: float | None = None
    status: int = 200
    hang: float = 0.0
    raw: bytes | None = None


Script = Callable[[int, dict[str, Any]], Reply]


@dataclass
class Provider:
    """The stand-in's state: its script, and every request it has seen."""

    script: Script
    base_url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: bool = False

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.bodies)

    @property
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        async def health(_: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def models(_: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": DEFAULT_MODEL}]})

        async def chat(request: Request) -> Response:
            try:
                body = json.loads(await request.body())
            except ValueError:
                body = {}
            with self._lock:
                n = len(self.bodies)
                self.bodies.append(body)
                self.authorizations.append(request.headers.get("authorization", ""))
            reply = self.script(n, body)
            deadline = time.monotonic() + reply.hang
            while time.monotonic() < deadline and not self._closing:
                await asyncio.sleep(0.05)
            if reply.raw is not None:
                return Response(reply.raw, media_type="application/json")
            if reply.status != 200:
                error = {"message": f"stand-in fault {reply.status}", "type": "server_error"}
                return JSONResponse({"error": error}, status_code=reply.status)
            return JSONResponse(_completion(n, body, reply), headers=_headers(reply))

        return Starlette(
            routes=[
                Route("/health", health),
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ]
        )


def _completion(n: int, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }
    if reply.cost is not None:
        usage["cost"] = reply.cost
    return {
        "id": f"chatcmpl-standin-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model if reply.model is not None else body.get("model", DEFAULT_MODEL),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


def _headers(reply: Reply) -> dict[str, str]:
    return {} if reply.cost is None else {"x-litellm-response-cost": repr(reply.cost)}


@contextlib.contextmanager
def standin(script: Script | Reply, host: str = "127.0.0.1") -> Iterator[Provider]:
    """Serve a stand-in provider on ``host`` (a free port) for the block's length."""
    from medomni_cas.bench.perception import serve

    if isinstance(script, Reply):
        fixed = script
        provider = Provider(lambda _n, _body: fixed)
    else:
        provider = Provider(script)
    with serve(provider, host=host, port=0) as url:
        provider.base_url = f"{url}/v1"
        try:
            yield provider
        finally:
            provider._closing = True  # hangs end, so the server can stop


# -- a model driving terminus-2 ----------------------------------------------------------------
#: what `TerminusScript` can make of a trial, from its second turn on
BEHAVIOURS = ("good", "other-model", "504", "hang", "over")
_SUBMISSION = re.compile(r"Write your answer to (/\S+) as one JSON object")
_TRIAL_ID = re.compile(r"\b([0-9a-f]{32})\b")
_CONFIRM = "Are you sure you want to mark the task as complete"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


@dataclass
class TerminusScript:
    """What a model answers Harbor's terminus-2 (JSON turns: analysis, plan, commands of
    keystrokes, task_complete), with one behaviour per trial.

    terminus-2's first prompt is the same for every trial, so the first turn has the shell
    print a checksum of the task's evidence; the checksum, in every later prompt of that
    trial, tells the trials apart. Trials get the behaviours of ``plan`` in the order their
    checksums first appear ("good" once the plan is used up):

    * ``good``: type the answer into the submission path the instruction names, mark the task
      complete, and confirm when asked;
    * ``other-model``: the same, reported as served by ``other``;
    * ``504``, ``hang``: every later request fails (HTTP 504; no answer for ``hang`` seconds),
      until ``healed`` is set, then "good";
    * ``over``: "good" with usage past any limit (250,000 prompt tokens and $2.5 a turn).

    Every analysis repeats ``leak`` (a key, as a careless model or a prompt injection might).
    ``of`` maps each checksum to its behaviour; ``answered`` counts the 200s per behaviour.
    """

    plan: Sequence[str] = ()
    served: str = DEFAULT_MODEL
    other: str = "other-model"
    answer: dict[str, Any] = field(default_factory=lambda: {"ckd_stage": "G2"})
    leak: str = ""
    prompt_tokens: int = 400
    completion_tokens: int = 30
    cost: float | None = 0.0015
    hang: float = 30.0
    healed: bool = False
    of: dict[str, str] = field(default_factory=dict)
    answered: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, n: int, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        found = _TRIAL_ID.search(" ".join(_text(m) for m in messages[1:]))
        reply = Reply(
            model=self.served,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cost=self.cost,
        )
        if found is None:
            turn: dict[str, Any] = {
                "analysis": f"First, which record this is. My key is {self.leak}.",
                "plan": "Checksum the evidence.",
                "commands": [
                    {"keystrokes": "cat /workspace/* 2>/dev/null | md5sum\n", "duration": 0.5}
                ],
                "task_complete": False,
            }
            return self._count("first", reply, turn)
        with self._lock:
            if found.group(1) not in self.of:
                i = len(self.of)
                self.of[found.group(1)] = self.plan[i] if i < len(self.plan) else "good"
            what = self.of[found.group(1)]
        if what in ("504", "hang") and self.healed:
            what = "good"
        if what == "504":
            return Reply(status=504)
        if what == "hang":
            return Reply(hang=self.hang)
        if what == "other-model":
            reply.model = self.other
        elif what == "over":
            reply.prompt_tokens, reply.cost = 250_000, 2.5
        if _CONFIRM in _text(messages[-1]):
            turn = {"analysis": f"Done ({self.leak}).", "plan": "", "commands": []}
        else:
            where = _SUBMISSION.search(_text(messages[0]))
            keys = f"printf '%s' '{json.dumps(self.answer)}' > {where.group(1)}\n" if where else ""
            turn = {
                "analysis": f"The task asks for the CKD stage. My key is {self.leak}.",
                "plan": "Write the answer where the instruction says.",
                "commands": [{"keystrokes": keys, "duration": 0.5}] if keys else [],
            }
        turn["task_complete"] = True
        return self._count(what, reply, turn)

    def _count(self, what: str, reply: Reply, turn: dict[str, Any]) -> Reply:
        reply.content = json.dumps(turn)
        with self._lock:
            self.answered[what] += 1
        return reply
