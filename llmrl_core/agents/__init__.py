"""OpenAI-API agents on llmrl's rollout engines: an OpenAI-compatible endpoint served from a resident engine
(:class:`AgentEndpoint`), the per-episode call recorder that builds exact-token training rows
(:class:`CallRecorder`), and the runner of agent episodes (:func:`run_agent_rollout`). See docs/agents.md."""

from llmrl_core.agents.loading import check_agent_env, load_agent
from llmrl_core.agents.recorder import CallRecord, CallRecorder, EpisodeLog
from llmrl_core.agents.rollout import AgentRollout, run_agent_rollout
from llmrl_core.agents.runner import EPISODE_HEADER, EpisodeJob, EpisodeOutcome, run_episodes
from llmrl_core.agents.server import AgentEndpoint, SamplingPolicy

__all__ = [
    "EPISODE_HEADER",
    "AgentEndpoint",
    "AgentRollout",
    "CallRecord",
    "CallRecorder",
    "EpisodeJob",
    "EpisodeLog",
    "EpisodeOutcome",
    "SamplingPolicy",
    "check_agent_env",
    "load_agent",
    "run_agent_rollout",
    "run_episodes",
]
