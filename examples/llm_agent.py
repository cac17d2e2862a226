"""A model-backed agent for the process runner: one chat completion per atom task.

Run by the process runner as ``python -m examples.llm_agent`` (``bench/agents/llm-local.yaml``)
against any OpenAI-compatible endpoint (vLLM, llama.cpp's server, Ollama, LiteLLM's proxy, a
hosted provider). It reads what every agent gets, the instruction (``MEDOMNI_INSTRUCTION``),
``answer_schema.json`` and the evidence files in its folder, asks the model ``MEDOMNI_MODEL``
once for the answer as one JSON object, and writes that object to ``MEDOMNI_SUBMISSION``.

Endpoint and key come from ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, which the ``openai``
client reads; the agent config passes them (``settings.env``), never writes them.

What it reports (``MEDOMNI_RUN_INFO``): the model the provider says served the request, the
``usage`` tokens, and the cost when the provider gives one (``usage.cost``, as OpenRouter
does, or LiteLLM's ``x-litellm-response-cost`` header). When the endpoint fails (a 5xx, a 429,
a time-out, no connection) it reports ``infra_error`` and exits 3: the run is an infrastructure
error, which the harness runs again on resume, when the process runner's relay to the endpoint
saw the fault too (``OPENAI_BASE_URL`` is the relay's; `medomni_cas.bench.endpoint_relay`).
It never retries by itself, so each request the provider sees is one the run records. Any
other failure (a 4xx, a body that is not a completion) is the agent's own: it exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["answer_text", "main", "prompt"]

_SKIP = {"instruction.md", "answer_schema.json"}
SYSTEM = (
    "You are a clinical prediction agent. Read the patient's record and answer the question. "
    "Reply with one JSON object and nothing else: one key per target of the answer schema."
)


def prompt(work: Path, instruction: Path, evidence_chars: int) -> str:
    """The user message: the instruction, the answer schema, then the evidence files (each
    cut to what is left of ``evidence_chars``)."""
    parts = [instruction.read_text(errors="replace")]
    schema = work / "answer_schema.json"
    if schema.is_file():
        parts.append("Answer schema:\n" + schema.read_text(errors="replace"))
    left = evidence_chars
    for f in sorted(work.rglob("*")):
        if not f.is_file() or f.name in _SKIP or f.name.startswith("."):
            continue
        if f.suffix not in (".jsonl", ".json", ".csv", ".txt", ".md") or left <= 0:
            parts.append(f"File {f.relative_to(work)}: ({f.stat().st_size} bytes, not shown)")
            continue
        text = f.read_text(errors="replace")[:left]
        left -= len(text)
        parts.append(f"File {f.relative_to(work)}:\n{text}")
    return "\n\n".join(parts)


def answer_text(content: str) -> str:
    """The JSON object in the model's reply (code fences and prose around it dropped); the
    reply as it is when it holds none, for the format check to refuse."""
    start, stop = content.find("{"), content.rfind("}")
    if start < 0 or stop < start:
        return content
    candidate = content[start : stop + 1]
    try:
        json.loads(candidate)
    except ValueError:
        return content
    return candidate


def _cost(usage: Any, headers: Any) -> float | None:
    cost = getattr(usage, "cost", None) if usage is not None else None
    if cost is None:
        cost = headers.get("x-litellm-response-cost")
    try:
        return None if cost is None else float(cost)
    except (TypeError, ValueError):
        return None


def _report(info: dict[str, Any]) -> None:
    path = os.environ.get("MEDOMNI_RUN_INFO")
    if path:
        Path(path).write_text(json.dumps(info))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.llm_agent", description=__doc__)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-tokens", type=int, default=512, help="completion tokens at most")
    p.add_argument("--evidence-chars", type=int, default=40_000, help="evidence shown at most")
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args(argv)

    import openai

    work = Path(os.environ.get("MEDOMNI_WORKSPACE", "."))
    instruction = Path(os.environ.get("MEDOMNI_INSTRUCTION", work / "instruction.md"))
    out = Path(os.environ.get("MEDOMNI_SUBMISSION", work / "answer.json"))
    model = os.environ.get("MEDOMNI_MODEL") or "default"
    client = openai.OpenAI(timeout=args.timeout, max_retries=0)  # retries are the harness's
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt(work, instruction, args.evidence_chars)},
            ],
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    except openai.APIStatusError as e:
        if e.status_code >= 500 or e.status_code == 429:
            _report({"infra_error": f"the endpoint answered {e.status_code}: {e.message}"})
            print(f"llm_agent: endpoint error {e.status_code}", file=sys.stderr)
            return 3
        raise
    except (openai.APITimeoutError, openai.APIConnectionError) as e:
        _report({"infra_error": f"the endpoint did not answer: {e}"})
        print(f"llm_agent: {e}", file=sys.stderr)
        return 3
    reply = raw.parse()  # a body that is not a completion raises: the agent's failure
    usage = reply.usage
    _report(
        {
            "served_model": reply.model,
            "tokens_in": usage.prompt_tokens if usage is not None else None,
            "tokens_out": usage.completion_tokens if usage is not None else None,
            "cost_usd": _cost(usage, raw.headers),
        }
    )
    content = (reply.choices[0].message.content or "") if reply.choices else ""
    out.write_text(answer_text(content))
    print(
        f"llm_agent: {model} served by {reply.model!r}, "
        f"{usage.total_tokens if usage is not None else '?'} tokens",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
