"""``EngineBatcher``: one thread owns a synchronous ``vllm.LLM`` and runs every request pending at that moment
as one batched ``generate`` call, so concurrent agents share the engine's batching."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from llmrl_core.modules.backends.types import Completion


@dataclass
class GenerationRequest:
    """One request for the engine: token-id prompt and its sampling settings (``n`` replies)."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    n: int = 1


_STOP = object()


class EngineBatcher:
    """Gathers the requests submitted from any thread and generates them together on its own engine thread.

    After the first pending request it waits ``gather_s`` for others to arrive, then takes everything pending (at
    most ``max_batch``) into one ``LLM.generate``; each request's future gets its ``n`` :class:`Completion`\\ s
    (token ids, sampler log-probs, finish reason). ``batch_sizes`` lists the size of every batch run."""

    def __init__(self, llm: Any, gather_s: float = 0.01, max_batch: int = 256) -> None:
        self.llm = llm
        self.gather_s = gather_s
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineBatcher:
        """Start the engine thread (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="llmrl-engine-batcher", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Finish the batch in progress, fail what is still queued, and end the engine thread."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None

    def submit(self, request: GenerationRequest) -> Future[list[Completion]]:
        """Queue ``request``; the future resolves to its completions (or the engine's exception)."""
        future: Future[list[Completion]] = Future()
        if self._thread is None:
            future.set_exception(RuntimeError("the engine batcher is not running"))
            return future
        self._queue.put((request, future))
        return future

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._drain()
                return
            items = [item]
            deadline = time.perf_counter() + self.gather_s
            stopping = False
            while len(items) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                items.append(nxt)
            self._run(items)
            if stopping:
                self._drain()
                return

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                item[1].set_exception(RuntimeError("the engine batcher stopped"))

    def _run(self, items: list[tuple[GenerationRequest, Future[list[Completion]]]]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        live = [(r, f) for r, f in items if f.set_running_or_notify_cancel()]
        if not live:
            return
        self.batch_sizes.append(len(live))
        try:
            params = [
                SamplingParams(
                    n=r.n,
                    max_tokens=r.max_tokens,
                    temperature=r.temperature,
                    top_p=r.top_p,
                    seed=r.seed,
                    stop=r.stop or None,
                    logprobs=0,
                )
                for r, _ in live
            ]
            prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r, _ in live]
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except BaseException as err:  # noqa: BLE001 - every waiting request learns why
            for _, future in live:
                future.set_exception(err)
            return
        for (_, future), out in zip(live, outputs, strict=True):
            replies = []
            for comp in out.outputs:
                ids = list(comp.token_ids)
                lps = [step[tok].logprob for tok, step in zip(ids, comp.logprobs or [], strict=True)]
                replies.append(Completion(list(out.prompt_token_ids), ids, lps, comp.text, comp.finish_reason))
            future.set_result(replies)
