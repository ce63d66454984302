"""Running agent episodes against an endpoint: each with its own episode id (sent on every call by its client),
at most ``concurrency`` at once, each bounded by ``timeout_s``. A crashing, hung or misbehaving agent fails its
own episode only (an :class:`EpisodeOutcome` with its error), never the others.

A coroutine agent gets an ``openai.AsyncOpenAI`` client and runs on one event loop (a timeout cancels it); a
plain function gets an ``openai.OpenAI`` client and runs in a thread of its own (a thread cannot be killed: at
the timeout its episode is closed, so the endpoint refuses its further calls, and the thread is abandoned).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmrl_core.agents.loading import is_async_agent
from llmrl_core.envs.reward_calls import as_reward_number

EPISODE_HEADER = "X-Episode-Id"


@dataclass
class EpisodeJob:
    """One episode to run: its id and the prompt row the agent gets."""

    episode_id: str
    row: dict[str, Any]


@dataclass
class EpisodeOutcome:
    """How an episode ended: ``reward`` (and the agent's other numbers, and messages if it gave them), or
    ``error`` (``"timeout"``, ``"crash"``, ``"bad_result"``) with a ``detail``."""

    episode_id: str
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    error: str | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the episode returned a usable reward."""
        return self.error is None


def read_result(episode_id: str, result: Any, seconds: float) -> EpisodeOutcome:
    """An agent's return value as an outcome: a finite number, or a dict with a finite ``"reward"`` (other
    numeric entries become reward components, ``"messages"`` the stored conversation). A number is what a reward
    function may return too (:func:`~llmrl_core.envs.reward_calls.as_reward_number`: a bool, an int, a float, a
    NumPy scalar or a one-element tensor), so ``return answer == gold`` and ``{"success": True}`` count."""
    components: dict[str, float] = {}
    messages = None
    reward = result
    if isinstance(result, Mapping):
        if "reward" not in result:
            return EpisodeOutcome(episode_id, error="bad_result", detail="the dict has no 'reward'", seconds=seconds)
        reward = result["reward"]
        for key, value in result.items():
            number = as_reward_number(value) if key != "reward" else None
            if number is not None and math.isfinite(number):
                components[str(key)] = number
        if isinstance(result.get("messages"), list):
            messages = [dict(m) for m in result["messages"] if isinstance(m, Mapping)]
    number = as_reward_number(reward)
    if number is None or not math.isfinite(number):
        detail = f"expected a finite number or {{'reward': number, ...}}, got {result!r}"[:500]
        return EpisodeOutcome(episode_id, error="bad_result", detail=detail, seconds=seconds)
    return EpisodeOutcome(episode_id, number, components, messages, seconds=seconds)


def _crash(episode_id: str, err: BaseException, seconds: float) -> EpisodeOutcome:
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    return EpisodeOutcome(episode_id, error="crash", detail=text[:2000], seconds=seconds)


def _timeout(episode_id: str, timeout_s: float) -> EpisodeOutcome:
    return EpisodeOutcome(episode_id, error="timeout", detail=f"ran past {timeout_s:g} s", seconds=timeout_s)


def run_episodes(
    agent: Callable[..., Any],
    jobs: Sequence[EpisodeJob],
    base_url: str,
    *,
    concurrency: int = 8,
    timeout_s: float = 120.0,
    on_end: Callable[[str], None] | None = None,
) -> list[EpisodeOutcome]:
    """Run every job's episode (see the module docstring); outcomes in the jobs' order. ``on_end(episode_id)`` is
    called as each episode ends, whichever way (the endpoint closes it there)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    end = on_end or (lambda episode_id: None)
    if is_async_agent(agent):
        box: list[list[EpisodeOutcome]] = []
        errors: list[BaseException] = []

        def main() -> None:  # a loop of its own: the caller's thread may already run one
            try:
                box.append(asyncio.run(_run_async(agent, jobs, base_url, concurrency, timeout_s, end)))
            except BaseException as err:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors.append(err)

        thread = threading.Thread(target=main, name="llmrl-agents", daemon=True)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return box[0]
    return _run_threads(agent, jobs, base_url, concurrency, timeout_s, end)


async def _run_async(
    agent: Callable[..., Any],
    jobs: Sequence[EpisodeJob],
    base_url: str,
    concurrency: int,
    timeout_s: float,
    end: Callable[[str], None],
) -> list[EpisodeOutcome]:
    import httpx
    import openai

    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=timeout_s) as http:
        base = openai.AsyncOpenAI(base_url=base_url, api_key="llmrl", max_retries=0, http_client=http)

        async def one(job: EpisodeJob) -> EpisodeOutcome:
            async with slots:
                client = base.with_options(default_headers={EPISODE_HEADER: job.episode_id})
                start = time.perf_counter()
                try:
                    result = await asyncio.wait_for(agent(dict(job.row), client), timeout_s)
                    return read_result(job.episode_id, result, time.perf_counter() - start)
                except TimeoutError:
                    return _timeout(job.episode_id, timeout_s)
                except Exception as err:  # the agent's failure is its episode's
                    return _crash(job.episode_id, err, time.perf_counter() - start)
                finally:
                    end(job.episode_id)

        return list(await asyncio.gather(*(one(job) for job in jobs)))


def _run_threads(
    agent: Callable[..., Any],
    jobs: Sequence[EpisodeJob],
    base_url: str,
    concurrency: int,
    timeout_s: float,
    end: Callable[[str], None],
) -> list[EpisodeOutcome]:
    import httpx
    import openai

    http = httpx.Client(trust_env=False, timeout=timeout_s)
    base = openai.OpenAI(base_url=base_url, api_key="llmrl", max_retries=0, http_client=http)
    outcomes: dict[str, EpisodeOutcome] = {}
    results: dict[str, EpisodeOutcome] = {}  # written by the episode threads
    pending = list(jobs)
    running: dict[str, float] = {}  # episode id -> start time

    def play(job: EpisodeJob, start: float) -> None:
        client = base.with_options(default_headers={EPISODE_HEADER: job.episode_id})
        try:
            result = agent(dict(job.row), client)
            results[job.episode_id] = read_result(job.episode_id, result, time.perf_counter() - start)
        except BaseException as err:  # noqa: BLE001 - the agent's failure is its episode's
            results[job.episode_id] = _crash(job.episode_id, err, time.perf_counter() - start)

    try:
        while pending or running:
            while pending and len(running) < concurrency:
                job = pending.pop(0)
                running[job.episode_id] = time.perf_counter()
                threading.Thread(
                    target=play, args=(job, running[job.episode_id]), name=f"agent-{job.episode_id}", daemon=True
                ).start()
            time.sleep(0.005)
            now = time.perf_counter()
            for episode_id, start in list(running.items()):
                outcome = results.get(episode_id)
                if outcome is None and now - start > timeout_s:
                    outcome = _timeout(episode_id, timeout_s)
                if outcome is not None:
                    outcomes[episode_id] = outcome
                    del running[episode_id]
                    end(episode_id)
    finally:
        http.close()  # an abandoned (timed-out) agent's later calls fail at once
    return [outcomes[job.episode_id] for job in jobs]
