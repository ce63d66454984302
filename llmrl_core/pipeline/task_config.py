"""``TaskConfig``: what the policy is asked and how it is scored, shared by rollouts and evaluation.

One section of a run's config builds both the rollout env (:func:`make_task_env`) and the evaluation
prompts and reward, so a version is always evaluated on exactly the prompt format and reward it trained on.
The defaults are the GSM8K ones (instruction in the system prompt and after the question, 0.1 format bonus).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
from llmrl_core.envs.transforms.few_shot import example_turns
from llmrl_core.pipeline.env_config import EnvConfig, build_env


@dataclass
class TaskConfig:
    """Prompt format (system prompt, question template, few-shot turns), reward values and held-out prompts."""

    system_prompt: str | None = GSM8K_SYSTEM_PROMPT  # the system turn of every prompt (None: none)
    question_template: str | None = GSM8K_QUESTION_TEMPLATE  # must contain {question}; None: the bare question
    few_shot: list[dict[str, Any]] = field(default_factory=list)  # [{question, response | turns}] before the question
    format_reward: float = 0.1  # for an answer tag with a wrong answer; 0 leaves nothing to farm
    correct_reward: float = 1.0  # for the right answer
    eval_source: str = "gsm8k:test"  # held-out prompts of the evaluate flow (gsm8k:test, arithmetic:test, a path)

    def __post_init__(self) -> None:
        if self.question_template is not None and "{question}" not in self.question_template:
            raise ValueError("task.question_template must contain '{question}'")
        for index, example in enumerate(self.few_shot):
            if not isinstance(example, dict):
                raise ValueError(f"task.few_shot[{index}]: expected a mapping, got {example!r:.80}")
            example_turns(example, f"task.few_shot[{index}]")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TaskConfig:
        """From a stored config's ``task`` section (unknown keys are an error; missing ones take defaults)."""
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"task: unknown key(s) {sorted(unknown)} (valid: {sorted(cls.__dataclass_fields__)})")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for lineage and evaluation settings)."""
        return asdict(self)


def make_task_env(
    task: TaskConfig, tokenizer: Any, *, input_mode: str = "tokens", env: EnvConfig | None = None
) -> ChatEnv:
    """The run's env (``env`` section, default: GSM8K-style answer-tag reward) with ``task``'s prompt format and
    reward values, for prompts given at reset (rollouts and evaluation pass their own rows)."""
    return build_env(env or EnvConfig(), task, tokenizer, input_mode=input_mode)
