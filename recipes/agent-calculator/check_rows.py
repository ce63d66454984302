"""Check a run's stored agent rows against what the agent was told: in every row, each masked (sampled) segment of
``response_tokens`` decodes to the reply the endpoint returned (a final answer's text, or a tool call's name and
arguments, as stored in the row's ``messages`` / ``tool_calls``), and the sampler log-probs are finite exactly on
the mask.

    .venv/bin/python recipes/agent-calculator/check_rows.py [RUN_ID] [RUNS_DIR]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from llmrl_core.agents.chat import parse_tool_calls
from llmrl_core.model_store import ensure_default_model
from llmrl_core.paths import llmrl_home
from storage.trajectories import TrajectoryStore


def sampled_segments(tokens: list[int], mask: list[bool]) -> list[list[int]]:
    """The runs of consecutive sampled ids (one per model call)."""
    segments: list[list[int]] = []
    current: list[int] = []
    for token, sampled in zip(tokens, mask, strict=True):
        if sampled:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    return segments


def row_consistent(record: Any, tokenizer: Any) -> bool:
    """Whether one stored row's sampled segments are the replies its agent received (see the module docstring)."""
    segments = sampled_segments(list(record.response_tokens), list(record.response_mask))
    replies = [m for m in record.messages if m["role"] == "assistant"][-len(segments) :]
    written = [(c["name"], json.loads(c["arguments"])) for c in record.tool_calls if c.get("arguments")]
    ok = len(replies) == len(segments)
    ok &= all(m == math.isfinite(lp) for m, lp in zip(record.response_mask, record.sampler_logprobs, strict=True))
    for ids, reply in zip(segments, replies, strict=False):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(text)
        if calls and (reply.get("content") or "") == text:  # a last reply whose call was never run: kept as text
            continue
        if calls:
            got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
            want, written = written[: len(got)], written[len(got) :]
            ok &= got == want and (reply.get("content") or "") == (content or "")
        else:
            ok &= text == (reply.get("content") or "")
    return ok and not written


def main(run_id: str = "agent-calculator-grpo", runs_dir: str | None = None) -> int:
    """Check every stored row of ``run_id``; prints a summary, returns the number of inconsistent rows."""
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    store = TrajectoryStore(Path(runs_dir or llmrl_home() / "runs") / "trajectories")
    total = bad = 0
    for version in store.versions(run_id):
        for record in store.read_records(run_id, version=version):
            total += 1
            bad += not row_consistent(record, tokenizer)
    print(f"{run_id}: {total - bad}/{total} stored rows: sampled segments decode to the replies the agent received")
    return bad


if __name__ == "__main__":
    sys.exit(1 if main(*sys.argv[1:3]) else 0)
