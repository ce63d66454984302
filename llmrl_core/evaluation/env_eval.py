"""Score a policy in the run's own environment, every turn included: tools executed, games played out.

``evaluate_env(worker, env, rows, n_samples, k_values, sampling)`` plays each held-out row to the end of its
episode in ``env`` — the same env a rollout worker builds from the run's ``env`` and ``task`` sections, so a
tool-using version is evaluated with its tool and a game with its game — through the rollout actors' episode
loop (:func:`~llmrl_core.collectors.dask_collector.collect_episodes`), greedy and sampled like
:func:`~llmrl_core.evaluation.gsm8k_eval.evaluate_prompts`.

Per sample: ``correct`` is the env's ``info["success"]`` (GSM8K-style parsers) or ``info["solved"]`` (games),
else ``reward > 0``; ``has_answer`` is the ``reward_answer`` component; ``num_tokens`` counts the policy's
tokens over all turns; ``text`` is the conversation after the prompt (assistant and tool turns). Extra
metrics: ``tool_call_rate`` (the episode called a tool), ``tool_calls`` and ``tool_errors`` (counts),
``turns``; :meth:`ModeResult.metrics` adds ``tool_success_rate`` (calls without error ÷ calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmrl_core.collectors.tensordict_batches import EpisodeRow
from llmrl_core.collectors.tensordict_batches import rows as episode_rows
from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.types import PromptRow
from llmrl_core.evaluation.gsm8k_eval import Advance, Progress, run_decoding_modes
from llmrl_core.evaluation.results import EvaluationResult, ModeResult, QuestionOutcome, SampleOutcome
from llmrl_core.modules.backends.types import SamplingConfig


def episode_outcome(t: EpisodeRow, policy_role: str = "assistant") -> SampleOutcome:
    """One finished episode as a scored sample (see the module docstring)."""
    info = t.info
    if "success" in info:
        correct = bool(info["success"])
    elif "solved" in info:
        correct = bool(info["solved"])
    else:
        correct = t.reward > 0
    calls = list(info.get("tool_calls", []))
    n_calls = int(info.get("num_tool_calls", len(calls)))
    errors = sum(1 for call in calls if call.get("error"))
    after = t.episode_messages
    text = (
        "\n".join(f"[{m['role']}] {m['content']}" for m in after)
        if len(after) > 1
        else (after[0]["content"] if after else "")
    )
    return SampleOutcome(
        text=text,
        answer=str(info.get("answer", "")),
        correct=correct,
        has_answer=bool(t.reward_components.get("reward_answer", 0.0)),
        reward=float(t.reward),
        num_tokens=int(t.policy_mask.sum()) if t.policy_mask is not None else t.num_sampled_tokens,
        finish_reason=t.finish_reason,
        extra={
            "tool_call_rate": float(n_calls > 0),
            "tool_calls": float(n_calls),
            "tool_errors": float(errors),
            "turns": float(t.num_turns),
        },
    )


def _play(
    worker: Any, env: ChatEnv, rows: Sequence[Mapping[str, Any]], prompt_field: str, sampling: SamplingConfig, n: int
) -> list[list[EpisodeRow]]:
    from llmrl_core.collectors.dask_collector import collect_episodes

    prompts = [
        PromptRow(data={**row, "query": row[prompt_field]}, prompt_id=i, group_id=i, sample_index=s)
        for i, row in enumerate(rows)
        for s in range(n)
    ]
    groups: list[list[EpisodeRow]] = [[] for _ in rows]
    for t in episode_rows(collect_episodes(worker, env, prompts, sampling)):
        groups[int(t.group_id)].append(t)  # type: ignore[arg-type]
    return [sorted(g, key=lambda t: t.sample_index) for g in groups]


def _mode(
    name: str, groups: list[list[EpisodeRow]], answers: Sequence[str], n: int, temperature: float, role: str
) -> ModeResult:
    questions = [
        QuestionOutcome(index, answers[index], [episode_outcome(t, role) for t in group])
        for index, group in enumerate(groups)
    ]
    return ModeResult(mode=name, n_samples=n, temperature=temperature, questions=questions)


def held_out_answers(rows: Sequence[Mapping[str, Any]], prompt_field: str, answer_field: str) -> list[str]:
    """Each row's ``answer_field`` as text, after checking there are rows and each has its prompt as a string."""
    if not rows:
        raise ValueError("no rows to evaluate")
    missing = [i for i, row in enumerate(rows) if not isinstance(row.get(prompt_field), str)]
    if missing:
        raise ValueError(
            f"row {missing[0]}: field {prompt_field!r} must be a string (fields: {sorted(rows[missing[0]])})"
        )
    return [str(row.get(answer_field, "")) for row in rows]


def evaluate_env(
    worker: Any,
    env: ChatEnv,
    rows: Sequence[Mapping[str, Any]],
    n_samples: int = 4,
    k_values: Sequence[int] = (1,),
    sampling: SamplingConfig | None = None,
    *,
    greedy: bool = True,
    prompt_field: str = "question",
    answer_field: str = "answer",
    settings: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> EvaluationResult:
    """Play every row in ``env`` with ``worker`` (greedy if ``greedy``, ``n_samples`` sampled if > 0) and score
    the episodes (see the module docstring). ``prompt_field`` is the row field that becomes the user message.
    ``progress`` (:data:`~llmrl_core.evaluation.gsm8k_eval.Progress`) is advanced a mode at a time."""
    answers = held_out_answers(rows, prompt_field, answer_field)

    def run_mode(name: str, cfg: SamplingConfig, n: int, advance: Advance | None) -> ModeResult:
        groups = _play(worker, env, rows, prompt_field, cfg, n)
        return _mode(name, groups, answers, n, cfg.temperature, env.policy_role)

    info = {"multi_turn": True, **dict(settings or {})}
    return run_decoding_modes(run_mode, len(rows), n_samples, k_values, sampling, greedy, info, progress)
