"""Score an OpenAI-API agent (``env.agent``) on held-out rows: every row is played by the agent against the
OpenAI-compatible endpoint served from the evaluation's engine (:func:`~llmrl_core.agents.run_agent_rollout`),
greedy and sampled like :func:`~llmrl_core.evaluation.env_eval.evaluate_env`.

The endpoint imposes the evaluation's sampling (temperature 0 for the greedy mode, the evaluation's temperature,
top-p, token cap and seed for the sampled one), whatever the agent asks for.

Per episode: ``correct`` (task success) is the agent's ``success`` entry when its result dict has one (> 0 is a
success), else ``reward > 0``; an episode that failed (crash, timeout, bad result, no model call) counts as not
correct, reward 0. ``has_answer`` is True for an episode that ended with a reward. ``num_tokens`` counts the
sampled tokens of the stored row; ``text`` is the conversation after the prompt. Extra metrics:
``agent_failed`` (the episode failed), ``tool_call_rate`` (the episode called a tool), ``tool_calls`` and
``turns`` (model calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmrl_core.agents.rollout import run_agent_rollout
from llmrl_core.agents.runner import EpisodeOutcome
from llmrl_core.collectors.tensordict_batches import EpisodeRow
from llmrl_core.envs.types import PromptRow
from llmrl_core.evaluation.env_eval import held_out_answers
from llmrl_core.evaluation.gsm8k_eval import Advance, Progress, run_decoding_modes
from llmrl_core.evaluation.results import EvaluationResult, ModeResult, QuestionOutcome, SampleOutcome
from llmrl_core.modules.backends.types import SamplingConfig

SUCCESS_KEY = "success"


def agent_success(outcome: EpisodeOutcome) -> bool:
    """Task success of one finished episode: the agent's ``success`` entry if it returned one, else reward > 0."""
    if not outcome.ok:
        return False
    if SUCCESS_KEY in outcome.components:
        return outcome.components[SUCCESS_KEY] > 0
    return (outcome.reward or 0.0) > 0


def agent_sample(outcome: EpisodeOutcome, row: EpisodeRow | None) -> SampleOutcome:
    """One agent episode as a scored sample (see the module docstring); ``row`` is its stored row, if any."""
    if row is None:
        return SampleOutcome(
            text=f"[failed: {outcome.error}] {outcome.detail}"[:2000],
            answer="",
            correct=False,
            has_answer=False,
            reward=0.0,
            num_tokens=0,
            finish_reason=outcome.error,
            extra={"agent_failed": 1.0, "tool_call_rate": 0.0, "tool_calls": 0.0, "turns": 0.0},
        )
    info = row.info
    n_calls = float(outcome.components.get("tool_calls", info.get("num_tool_calls", 0)))
    text = "\n".join(f"[{m['role']}] {m['content']}" for m in row.episode_messages)
    return SampleOutcome(
        text=text,
        answer="",
        correct=agent_success(outcome),
        has_answer=True,
        reward=float(outcome.reward or 0.0),
        num_tokens=int(row.policy_mask.sum()) if row.policy_mask is not None else row.num_sampled_tokens,
        finish_reason=row.finish_reason,
        extra={
            "agent_failed": 0.0,
            "tool_call_rate": float(n_calls > 0),
            "tool_calls": n_calls,
            "turns": float(info.get("agent_calls", row.num_turns)),
        },
    )


def _play(
    worker: Any,
    agent: str,
    rows: Sequence[Mapping[str, Any]],
    prompt_field: str,
    sampling: SamplingConfig,
    n: int,
    tokenizer: Any,
    concurrency: int,
    timeout_s: float,
) -> list[list[SampleOutcome]]:
    prompts = [
        PromptRow(data=dict(row), prompt_id=i, group_id=i, sample_index=s)
        for i, row in enumerate(rows)
        for s in range(n)
    ]
    rollout = run_agent_rollout(
        worker,
        agent,
        prompts,
        sampling,
        tokenizer=tokenizer,
        concurrency=concurrency,
        timeout_s=timeout_s,
        prompt_field=prompt_field,
    )
    stored = {(int(r.group_id), int(r.sample_index)): r for r in rollout.rows}  # type: ignore[arg-type]
    groups: list[list[SampleOutcome]] = [[] for _ in rows]
    for prompt, outcome in zip(prompts, rollout.outcomes, strict=True):
        row = stored.get((prompt.group_id, prompt.sample_index)) if outcome.ok else None
        groups[prompt.group_id].append(agent_sample(outcome, row))
    return groups


def evaluate_agent(
    worker: Any,
    agent: str,
    rows: Sequence[Mapping[str, Any]],
    n_samples: int = 4,
    k_values: Sequence[int] = (1,),
    sampling: SamplingConfig | None = None,
    *,
    tokenizer: Any,
    greedy: bool = True,
    prompt_field: str = "question",
    answer_field: str = "answer",
    concurrency: int = 8,
    timeout_s: float = 120.0,
    settings: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> EvaluationResult:
    """Play every row with the agent ``agent`` (``module:function``) against ``worker``'s engine (greedy if
    ``greedy``, ``n_samples`` sampled episodes if > 0) and score task success (see the module docstring).
    ``tokenizer``: the endpoint's own copy of the engine's tokenizer. ``progress`` is advanced a mode at a time."""
    answers = held_out_answers(rows, prompt_field, answer_field)

    def run_mode(name: str, cfg: SamplingConfig, n: int, advance: Advance | None) -> ModeResult:
        groups = _play(worker, agent, rows, prompt_field, cfg, n, tokenizer, concurrency, timeout_s)
        questions = [QuestionOutcome(i, answers[i], samples) for i, samples in enumerate(groups)]
        return ModeResult(mode=name, n_samples=n, temperature=cfg.temperature, questions=questions)

    info = {"multi_turn": True, "agent": agent, **dict(settings or {})}
    return run_decoding_modes(run_mode, len(rows), n_samples, k_values, sampling, greedy, info, progress)
