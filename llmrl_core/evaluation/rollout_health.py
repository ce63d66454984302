"""Per-iteration health of a batch of rollouts: is the policy still learning, or collapsing?

Collapse shows up before the reward does: every sample of a group becomes the same text (no GRPO signal
left), responses shrink to a farmed minimum or grow to the token limit. :func:`rollout_health` turns a
batch into the numbers the GRPO flow logs every iteration (MLflow and the per-iteration table).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence


def rollout_health(
    texts: Sequence[str],
    group_ids: Sequence[object],
    correct: Sequence[bool],
    has_answer: Sequence[bool],
    num_tokens: Sequence[int],
    truncated: Sequence[bool],
) -> dict[str, float]:
    """Metrics of one batch (all sequences aligned, one item per response):

    * ``accuracy``: fraction of correct responses; ``answer_rate``: fraction with an answer tag;
    * ``distinct_responses``: mean over groups of (distinct texts / group size): 1.0 when every sample
      differs, ``1/G`` when a group answers identically;
    * ``identical_groups``: fraction of groups (of more than one sample) whose samples are all the same text;
    * ``response_tokens_mean`` / ``_min`` / ``_max`` and ``truncated_rate`` (hit the token limit).
    """
    n = len(texts)
    if n == 0:
        raise ValueError("rollout_health needs at least one response")
    for name, seq in (("group_ids", group_ids), ("correct", correct), ("has_answer", has_answer)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} items for {n} texts")
    if len(num_tokens) != n or len(truncated) != n:
        raise ValueError(f"num_tokens/truncated need {n} items")
    groups: dict[object, list[str]] = defaultdict(list)
    for text, group in zip(texts, group_ids, strict=True):
        groups[group].append(text.strip())
    multi = [g for g in groups.values() if len(g) > 1]
    return {
        "accuracy": sum(map(bool, correct)) / n,
        "answer_rate": sum(map(bool, has_answer)) / n,
        "distinct_responses": sum(len(set(g)) / len(g) for g in groups.values()) / len(groups),
        "identical_groups": (sum(len(set(g)) == 1 for g in multi) / len(multi)) if multi else 0.0,
        "response_tokens_mean": sum(num_tokens) / n,
        "response_tokens_min": float(min(num_tokens)),
        "response_tokens_max": float(max(num_tokens)),
        "truncated_rate": sum(map(bool, truncated)) / n,
    }
