"""Every call an agent makes, recorded against its episode, and the episode's one training row built from the
exact tokens the engine saw and sampled.

The prefix rule: a call that continues an earlier call of its episode (its chat messages are the earlier call's
messages, then the reply the endpoint gave, then new messages; or its completion prompt starts with the earlier
prompt and completion) gets the prompt ids ``earlier prompt ids + earlier sampled ids + ids of the new text
only`` (the new text is what the chat template renders after the earlier context). Nothing sampled is ever
re-tokenized, so the stored row holds the engine's own tokens and the trainer scores what the sampler drew.

A call that continues no earlier call (the agent rewrote its history, or started over) starts a new chain from a
fresh rendering. The training row is the chain that ends in the episode's last call; calls off that chain are
not trained, and the row says so (``info["history_rewritten"]``, ``info["agent_calls"]`` against
``info["agent_calls_trained"]``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl_core.agents.chat import content_text, normalize_message, render_chat, same_reply
from llmrl_core.collectors.tensordict_batches import EpisodeRow

STORED_ROLES = ("system", "user", "assistant", "tool")  # what the trajectory store accepts
ROLE_ALIASES = {"developer": "system", "function": "tool", "ipython": "tool"}


def stored_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the trajectory store keeps them: ``{role, content}`` with text content, OpenAI's other roles
    mapped (``developer`` -> system, ``function`` -> tool); raises ValueError for a message it cannot store."""
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] is not a mapping: {message!r}"[:300])
        role = ROLE_ALIASES.get(str(message.get("role")), str(message.get("role")))
        if role not in STORED_ROLES:
            raise ValueError(f"messages[{index}]: role {message.get('role')!r} is not one of {STORED_ROLES}")
        out.append({"role": role, "content": content_text(message.get("content"))})
    return out


@dataclass
class CallRecord:
    """One sampled reply of the endpoint: exact prompt ids, sampled ids and their sampler log-probs."""

    kind: str  # "chat" or "completion"
    context_text: str  # the rendered prompt (chat) or the prompt text (completion)
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    policy_version: Any
    messages: list[dict[str, Any]] | None = None  # chat: the request's messages (normalised)
    tools: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None  # chat: the assistant message as returned
    parent: int | None = None  # index of the call this one continues (None: a fresh rendering)
    reformatted: bool = False  # the template renders the earlier reply otherwise than it was sampled


@dataclass
class PromptPlan:
    """The prompt ids of a new call and the earlier call it continues (if any)."""

    prompt_ids: list[int]
    context_text: str
    parent: int | None
    reformatted: bool = False


class EpisodeLog:
    """The calls of one episode, in the order their replies were sent."""

    def __init__(self, episode_id: str) -> None:
        self.episode_id = episode_id
        self.calls: list[CallRecord] = []
        self.closed = False
        self.lock = threading.Lock()

    # --- planning a call ----------------------------------------------------------------------------------
    def plan_chat(
        self, tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None
    ) -> PromptPlan:
        """The prompt ids of a chat call: continuing the latest earlier call it extends, else freshly rendered."""
        messages = [normalize_message(m) for m in messages]
        rendered = render_chat(tokenizer, messages, tools)
        for index in range(len(self.calls) - 1, -1, -1):
            suffix = self._chat_suffix(tokenizer, self.calls[index], messages, tools, rendered)
            if suffix is not None:
                earlier = self.calls[index]
                ids = earlier.prompt_ids + earlier.token_ids + tokenizer.encode(suffix[0], add_special_tokens=False)
                return PromptPlan(ids, rendered, index, suffix[1])
        return PromptPlan(tokenizer.encode(rendered, add_special_tokens=False), rendered, None)

    @staticmethod
    def _chat_suffix(
        tokenizer: Any, earlier: CallRecord, messages: list[dict[str, Any]], tools: Any, rendered: str
    ) -> tuple[str, bool] | None:
        """``(new text, reformatted)`` when ``messages`` continue ``earlier``, else None."""
        if (
            earlier.kind != "chat"
            or earlier.messages is None
            or earlier.reply is None
            or (tools or None) != (earlier.tools or None)
        ):
            return None
        n = len(earlier.messages)
        if len(messages) <= n or messages[:n] != earlier.messages or not same_reply(messages[n], earlier.reply):
            return None
        sampled = tokenizer.decode(earlier.token_ids, skip_special_tokens=False)
        if rendered.startswith(earlier.context_text + sampled):  # the template renders the reply as sampled
            return rendered[len(earlier.context_text + sampled) :], False
        # The template renders the reply otherwise (e.g. tool calls in its own format): keep the sampled ids, close
        # the turn as the template does and append what follows the reply.
        upto = render_chat(tokenizer, messages[: n + 1], tools, add_generation_prompt=False)
        if not (upto.startswith(earlier.context_text) and rendered.startswith(upto)):
            return None
        turn = upto[len(earlier.context_text) :]
        eos_text, eos_id = tokenizer.eos_token, tokenizer.eos_token_id
        closing = turn[turn.rfind(eos_text) :] if eos_text and eos_text in turn else ""
        if closing and earlier.token_ids and earlier.token_ids[-1] == eos_id:
            closing = closing[len(eos_text) :]
        return closing + rendered[len(upto) :], True

    def plan_completion(self, tokenizer: Any, prompt: str | list[int]) -> PromptPlan:
        """The prompt ids of a completion call (a text or token-id prompt), continuing an earlier one if it can."""
        for index in range(len(self.calls) - 1, -1, -1):
            earlier = self.calls[index]
            if earlier.kind != "completion":
                continue
            done = earlier.prompt_ids + earlier.token_ids
            if isinstance(prompt, list):
                if len(prompt) > len(done) and prompt[: len(done)] == done:
                    return PromptPlan(list(prompt), tokenizer.decode(prompt, skip_special_tokens=False), index)
                continue
            context = earlier.context_text + tokenizer.decode(earlier.token_ids, skip_special_tokens=False)
            if prompt.startswith(context) and len(prompt) > len(context):
                ids = done + tokenizer.encode(prompt[len(context) :], add_special_tokens=False)
                return PromptPlan(ids, prompt, index)
        if isinstance(prompt, list):
            return PromptPlan(list(prompt), tokenizer.decode(prompt, skip_special_tokens=False), None)
        return PromptPlan(tokenizer.encode(prompt), prompt, None)

    def add(self, call: CallRecord) -> None:
        """Record a call whose reply was sent."""
        self.calls.append(call)

    # --- the training row ---------------------------------------------------------------------------------
    def chain(self) -> list[CallRecord]:
        """The calls the training row is built from: the last call and the earlier calls it continues, in order."""
        if not self.calls:
            return []
        out, index = [], len(self.calls) - 1
        while index is not None:
            out.append(self.calls[index])
            index = self.calls[index].parent
        return out[::-1]

    def to_row(
        self,
        data: Mapping[str, Any],
        prompt_id: Any,
        group_id: Any,
        sample_index: int,
        reward: float,
        reward_components: Mapping[str, float] | None = None,
        messages: list[dict[str, Any]] | None = None,
    ) -> EpisodeRow:
        """The episode as one :class:`EpisodeRow` (what ``runtime.records.trajectory_to_record`` stores): the chain's
        last prompt and reply as tokens, the policy mask True exactly on the sampled ids."""
        chain = self.chain()
        if not chain:
            raise ValueError(f"episode {self.episode_id}: the agent made no call to the model")
        last = chain[-1]
        tokens = last.prompt_ids + last.token_ids
        mask = [False] * len(tokens)
        logprobs: dict[int, float] = {}
        for call in chain:
            start = len(call.prompt_ids)
            if tokens[start : start + len(call.token_ids)] != call.token_ids:  # the prefix rule, checked
                raise RuntimeError(f"episode {self.episode_id}: a continued call lost an earlier call's sampled ids")
            for offset, lp in enumerate(call.logprobs):
                mask[start + offset] = True
                logprobs[start + offset] = lp
        episode = stored_messages(messages if messages is not None else self._messages(last))
        first_reply = next((i for i, m in enumerate(episode) if m["role"] == "assistant"), len(episode))
        tool_calls = self._tool_calls(last)
        return EpisodeRow(
            messages=episode,
            episode_messages=episode[first_reply:],
            tokens=torch.tensor(tokens, dtype=torch.long),
            policy_mask=torch.tensor(mask, dtype=torch.bool),
            sampler_log_probs=torch.tensor([logprobs[i] for i in sorted(logprobs)], dtype=torch.float32),
            response_text=last.text,
            reward=float(reward),
            terminated=True,
            truncated=last.finish_reason == "length",
            prompt_id=prompt_id,
            group_id=group_id,
            sample_index=int(sample_index),
            num_turns=len(chain),
            num_sampled_tokens=sum(len(c.token_ids) for c in chain),
            finish_reason=last.finish_reason,
            reward_components=dict(reward_components or {}),
            policy_versions=[c.policy_version for c in chain],
            data=dict(data),
            info={
                "episode_id": self.episode_id,
                "agent_calls": len(self.calls),
                "agent_calls_trained": len(chain),
                "history_rewritten": len(chain) < len(self.calls),
                "reformatted_replies": sum(c.reformatted for c in chain),
                "num_tool_calls": len(tool_calls),
                "tool_calls": tool_calls,
            },
        )

    @staticmethod
    def _tool_calls(last: CallRecord) -> list[dict[str, Any]]:
        """The tools the agent ran, as the last call's context shows them: one entry per ``tool`` message (its
        call's name and arguments when the model wrote the call, ``turn``: the assistant replies before it)."""
        calls: dict[str, dict[str, Any]] = {}
        out, turn = [], 0
        for message in last.messages or []:
            if message["role"] == "assistant":
                turn += 1
                calls.update({c["id"]: c["function"] for c in message.get("tool_calls", [])})
            elif message["role"] == "tool":
                function = calls.get(message.get("tool_call_id", ""), {})
                out.append(
                    {
                        "turn": max(0, turn - 1),
                        "name": function.get("name") or message.get("name") or "tool",
                        "arguments": function.get("arguments", ""),
                        "result": message.get("content", ""),
                        "error": False,  # the endpoint cannot tell a failed tool run from a result
                    }
                )
        return out

    @staticmethod
    def _messages(last: CallRecord) -> list[dict[str, Any]]:
        """The conversation of the last call and its reply (a completion call: its prompt and completion)."""
        if last.kind == "chat" and last.messages is not None:
            reply = {"role": "assistant", "content": last.text}
            return [*last.messages, reply]
        return [{"role": "user", "content": last.context_text}, {"role": "assistant", "content": last.text}]


@dataclass
class CallRecorder:
    """The episode logs of an endpoint. ``open_only``: calls must name an episode opened with :meth:`open` and
    not yet closed (the flows' rollouts); otherwise any episode id (or none: ``"default"``) is recorded."""

    open_only: bool = False
    episodes: dict[str, EpisodeLog] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, episode_id: str) -> EpisodeLog:
        """Start recording ``episode_id`` (a new, empty log)."""
        with self.lock:
            log = self.episodes[episode_id] = EpisodeLog(episode_id)
            return log

    def close(self, episode_id: str) -> EpisodeLog | None:
        """Stop accepting calls for ``episode_id``; returns its log."""
        with self.lock:
            log = self.episodes.get(episode_id)
            if log is not None:
                log.closed = True
            return log

    def log_for(self, episode_id: str | None) -> EpisodeLog:
        """The open log a call records into; raises KeyError (with the reason) when the call is not accepted."""
        with self.lock:
            if episode_id is None:
                if self.open_only:
                    raise KeyError(
                        "no episode id: send it as the X-Episode-Id header, extra_body={'episode_id': ...} or user"
                    )
                episode_id = "default"
            log = self.episodes.get(episode_id)
            if log is None:
                if self.open_only:
                    raise KeyError(f"unknown episode id {episode_id!r}")
                log = self.episodes[episode_id] = EpisodeLog(episode_id)
            if log.closed:
                raise KeyError(f"episode {episode_id!r} is over (finished, failed or timed out)")
            return log
