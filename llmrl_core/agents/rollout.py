"""One rollout of agent episodes on a resident engine: serve the endpoint for the rollout's duration, run an
episode per prompt row, and turn each finished episode into its training row (failed ones into outcomes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmrl_core.agents.loading import load_agent
from llmrl_core.agents.recorder import CallRecorder
from llmrl_core.agents.runner import EpisodeJob, EpisodeOutcome, run_episodes
from llmrl_core.agents.server import AgentEndpoint, SamplingPolicy
from llmrl_core.collectors.tensordict_batches import EpisodeRow
from llmrl_core.envs.types import PromptRow
from llmrl_core.modules.backends.types import SamplingConfig


@dataclass
class AgentRollout:
    """The episodes of one agent rollout: training rows of the episodes that ended with a reward, the outcome of
    every episode, and the sizes of the engine batches that served them."""

    rows: list[EpisodeRow]
    outcomes: list[EpisodeOutcome]
    batch_sizes: list[int]
    ignored: dict[str, int] = field(default_factory=dict)  # calls per request setting not honoured

    @property
    def failures(self) -> list[EpisodeOutcome]:
        """The episodes that failed (crash, timeout, bad result, or no model call)."""
        return [o for o in self.outcomes if not o.ok]

    def metrics(self) -> dict[str, float]:
        """``agent_episodes``, ``agent_failures`` (and by kind), ``agent_calls_mean``, ``agent_rewritten`` (rows
        whose agent rewrote its history), ``engine_batch_mean`` (requests per engine batch), and
        ``agent_ignored_<setting>``: calls that set a request setting the endpoint does not honour
        (:mod:`llmrl_core.agents.ignored_settings`)."""
        kinds: dict[str, float] = {}
        for outcome in self.failures:
            kinds[f"agent_failures_{outcome.error}"] = kinds.get(f"agent_failures_{outcome.error}", 0.0) + 1
        calls = [r.info["agent_calls"] for r in self.rows]
        return {
            "agent_episodes": float(len(self.outcomes)),
            "agent_failures": float(len(self.failures)),
            **kinds,
            "agent_calls_mean": sum(calls) / len(calls) if calls else 0.0,
            "agent_rewritten": float(sum(bool(r.info["history_rewritten"]) for r in self.rows)),
            "engine_batch_mean": sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0,
            **{f"agent_ignored_{name}": float(count) for name, count in sorted(self.ignored.items())},
        }


def agent_row(data: dict[str, Any], prompt_field: str) -> dict[str, Any]:
    """The row an agent is given: the data row's fields, with the prompt under ``query`` and under
    ``prompt_field`` (the loader renamed it to ``query``; an agent written against the data reads its own name)."""
    row = dict(data)
    if "query" in row:
        row.setdefault(prompt_field, row["query"])
    elif prompt_field in row:
        row["query"] = row[prompt_field]
    return row


def episode_id(row: PromptRow, index: int) -> str:
    """A deterministic episode id (reproducible seeds): the row's place in the rollout and its group identity."""
    return f"e{index}-p{row.prompt_id}-g{row.group_id}-s{row.sample_index}"


def run_agent_rollout(
    worker: Any,
    agent_path: str,
    rows: Sequence[PromptRow],
    sampling: SamplingConfig,
    *,
    tokenizer: Any,
    concurrency: int = 8,
    timeout_s: float = 120.0,
    model_name: str = "policy",
    host: str = "127.0.0.1",
    prompt_field: str = "question",
) -> AgentRollout:
    """Run ``agent_path``'s agent once per row against ``worker``'s engine (a
    :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker`) at its current policy version. The endpoint imposes
    ``sampling``'s temperature and top-p, caps replies at its ``max_new_tokens``, and seeds every call from its
    seed. ``tokenizer``: the endpoint's own copy of the engine's tokenizer. Each agent gets its row with the prompt
    under ``query`` (as the built-in envs see it) and under its data field ``prompt_field`` too, as the held-out
    evaluation gives it (:func:`agent_row`)."""
    agent = load_agent(agent_path)
    recorder = CallRecorder(open_only=True)
    jobs = []
    for index, row in enumerate(rows):
        job = EpisodeJob(episode_id(row, index), agent_row(row.data, prompt_field))
        recorder.open(job.episode_id)
        jobs.append(job)
    wake = getattr(worker, "wake", None)
    if wake is not None:  # the endpoint drives the engine itself: take its memory back if it sleeps
        wake()
    endpoint = AgentEndpoint(
        worker.llm,
        tokenizer,
        model_name=model_name,
        policy_version=worker.policy_version,
        max_model_len=int(worker.config.max_model_len),
        sampling=SamplingPolicy(sampling.temperature, sampling.top_p, sampling.max_new_tokens, sampling.seed),
        recorder=recorder,
        host=host,
    )
    with endpoint:
        outcomes = run_episodes(
            agent, jobs, endpoint.base_url, concurrency=concurrency, timeout_s=timeout_s, on_end=recorder.close
        )
    out_rows = []
    for row, job, outcome in zip(rows, jobs, outcomes, strict=True):
        log = recorder.episodes[job.episode_id]
        if outcome.ok and not log.calls:
            outcome.error, outcome.detail = "no_call", "the agent returned without calling the model"
        if not outcome.ok:
            continue
        components = {"agent": float(outcome.reward or 0.0), **outcome.components}
        reward = float(outcome.reward or 0.0)
        try:
            out_rows.append(
                log.to_row(
                    row.data, row.prompt_id, row.group_id, row.sample_index, reward, components, outcome.messages
                )
            )
        except ValueError as err:  # e.g. messages the agent returned that cannot be stored: its episode only
            outcome.error, outcome.detail = "bad_result", str(err)
    return AgentRollout(out_rows, list(outcomes), list(endpoint.batcher.batch_sizes), dict(endpoint.ignored))
