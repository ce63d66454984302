"""``AgentEndpoint``: an OpenAI-compatible HTTP endpoint on a resident engine (``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses`` (:mod:`llmrl_core.agents.responses_api`), ``/v1/models``), bound to
127.0.0.1 by default, recording every call against its episode.

The episode id of a call is read from the ``X-Episode-Id`` header, else the body's ``episode_id`` (the
``openai`` client's ``extra_body``), else its ``user`` field. Sampling follows :class:`SamplingPolicy`: in a
training rollout the run's temperature and top-p are imposed (the trainer scores the distribution the sampler
drew from), ``max_tokens`` is capped at the run's ``rollout.max_new_tokens`` and at the context left, and
each call's seed derives from the rollout's seed, the episode id and the call's index in its episode.
Requests are answered by one :class:`~llmrl_core.agents.batcher.EngineBatcher` (concurrent calls run as one
batch). ``stream: true`` gets the reply as server-sent events once it is generated
(:mod:`llmrl_core.agents.streaming`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request  # module level: the routes' annotations are resolved in this module's namespace

from llmrl_core.agents.batcher import EngineBatcher, GenerationRequest
from llmrl_core.agents.chat import normalize_message, parse_tool_calls
from llmrl_core.agents.ignored_settings import WHY, ignored_settings
from llmrl_core.agents.recorder import CallRecord, CallRecorder, EpisodeLog, PromptPlan
from llmrl_core.agents.request_error import RequestError
from llmrl_core.agents.responses_api import chat_body_from_responses, response_from_chat, response_stream_events
from llmrl_core.agents.streaming import stream_events

logger = logging.getLogger("llmrl.agents")


@dataclass
class SamplingPolicy:
    """How the endpoint samples: ``temperature``/``top_p`` None take the request's values (OpenAI defaults: 1),
    set they are imposed; ``max_tokens`` caps every reply; ``seed`` None takes the request's seed, set it seeds
    every call from ``(seed, episode id, call index)``."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int = 512
    seed: int | None = None


def _number(body: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(f"{key} must be a number in [{low}, {high}], got {value!r}", param=key)
    return float(value)


class AgentEndpoint:
    """The OpenAI-compatible endpoint of one engine (see the module docstring); ``start()`` serves it from a
    background thread, ``stop()`` ends it. ``recorder`` holds the calls of every episode."""

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        policy_version: Any = 0,
        max_model_len: int = 2048,
        sampling: SamplingPolicy | None = None,
        recorder: CallRecorder | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.policy_version = policy_version
        self.max_model_len = max_model_len
        self.sampling = sampling or SamplingPolicy()
        self.recorder = recorder or CallRecorder()
        self.batcher = EngineBatcher(llm)
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.ignored: Counter[str] = Counter()  # calls per setting accepted and not honoured (ignored_settings)
        self.app = self._make_app()

    # --- life cycle ---------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The ``base_url`` an ``openai`` client takes (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> AgentEndpoint:
        """Serve the endpoint (port 0: a free port, then in :attr:`port`) until :meth:`stop`."""
        import uvicorn

        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self.batcher.start()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="llmrl-agent-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.perf_counter() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.perf_counter() > deadline:
                raise RuntimeError(f"the agent endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (requests in flight finish first) and stop the engine thread."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=30)
            self._thread = None
        self.batcher.stop()

    def __enter__(self) -> AgentEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- requests -----------------------------------------------------------------------------------------
    def _make_app(self) -> Any:
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="llmrl agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        def error(err: RequestError) -> JSONResponse:
            kind = "invalid_request_error" if err.status < 500 else "server_error"
            body = {"error": {"message": str(err), "type": kind, "param": err.param, "code": None}}
            return JSONResponse(body, status_code=err.status)

        async def handle(request: Request, kind: str) -> Any:
            try:
                try:
                    body = await request.json()
                except ValueError as err:
                    raise RequestError(f"the body is not JSON ({err})") from err
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                episode = request.headers.get("x-episode-id") or body.get("episode_id") or body.get("user")
                stream = body.get("stream")
                if stream not in (None, True, False):
                    raise RequestError(f"stream must be true or false, got {stream!r}", param="stream")
                if kind == "responses":  # OpenAI's Responses API: the chat call it translates to
                    chat = await self._chat(chat_body_from_responses(body), episode)
                    out = response_from_chat(chat, body)
                    events = response_stream_events(out)
                else:
                    out = await (self._chat(body, episode) if kind == "chat" else self._completion(body, episode))
                    events = stream_events(out, body)
                if stream:  # the whole reply, generated and recorded, sent as server-sent events
                    return StreamingResponse(events, media_type="text/event-stream")
                return out
            except RequestError as err:
                return error(err)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "llmrl",
                        "max_model_len": self.max_model_len,
                        "policy_version": self.policy_version,
                    }
                ],
            }

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await handle(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await handle(request, "completion")

        @app.post("/v1/responses")
        async def responses(request: Request) -> Any:
            return await handle(request, "responses")

        return app

    def _episode(self, episode: Any) -> EpisodeLog:
        try:
            return self.recorder.log_for(None if episode is None else str(episode))
        except KeyError as err:
            raise RequestError(err.args[0], status=409 if episode is not None else 400, param="episode_id") from err

    def _request(self, body: Mapping[str, Any], log: EpisodeLog, prompt_ids: list[int]) -> GenerationRequest:
        policy = self.sampling
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt_ids)} tokens: no room left in the engine's context "
                f"({self.max_model_len} tokens, rollout.max_model_len)",
                param="messages",
            )
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
            raise RequestError(f"max_tokens must be a positive integer, got {asked!r}", param="max_tokens")
        n = body.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 16:
            raise RequestError(f"n must be an integer in [1, 16], got {n!r}", param="n")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0) if policy.temperature is None else policy.temperature
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0) if policy.top_p is None else policy.top_p
        if top_p <= 0:
            raise RequestError("top_p must be > 0", param="top_p")
        self._note_ignored(body)  # every generation route: chat, completions, and responses through chat
        seed = body.get("seed") if policy.seed is None else None
        if policy.seed is not None:
            seed = zlib.crc32(f"{policy.seed}/{log.episode_id}/{len(log.calls)}".encode()) & 0x7FFFFFFF
        return GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=min(policy.max_tokens, room, asked or policy.max_tokens),
            temperature=temperature,
            top_p=top_p,
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
            stop=stop,
            n=n,
        )

    async def _generate(self, request: GenerationRequest) -> list[Any]:
        try:
            return await asyncio.wrap_future(self.batcher.submit(request))
        except Exception as err:  # the engine's own error, as a server error for this call only
            raise RequestError(f"generation failed: {err}", status=500) from err

    def _logprobs(self, ids: list[int], lps: list[float]) -> dict[str, Any]:
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        return {
            "content": [
                {"token": t, "logprob": lp if math.isfinite(lp) else -9999.0, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, lps, strict=True)
            ]
        }

    def _note_ignored(self, body: Mapping[str, Any]) -> None:
        """Count the settings of ``body`` the endpoint does not honour; the first of each kind is logged."""
        for name in ignored_settings(body):
            if not self.ignored[name]:
                logger.warning("agent endpoint: the agent sets %s, which has no effect here (%s)", name, WHY[name])
            self.ignored[name] += 1

    async def _chat(self, body: Mapping[str, Any], episode: Any) -> dict[str, Any]:
        log = self._episode(episode)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("tools must be a list", param="tools")
        try:
            with log.lock:
                plan: PromptPlan = log.plan_chat(self.tokenizer, messages, tools)
        except ValueError as err:
            raise RequestError(str(err), param="messages") from err
        request = self._request(body, log, plan.prompt_ids)
        replies = await self._generate(request)
        normalized = [normalize_message(m) for m in messages]
        parse = tools is not None and body.get("tool_choice") != "none"
        choices = []
        for index, comp in enumerate(replies):
            content, calls = parse_tool_calls(comp.text) if parse else (comp.text, [])
            reply: dict[str, Any] = {"role": "assistant", "content": content or ""}
            if calls:
                reply["tool_calls"] = calls
            self._record(log, "chat", plan, comp, messages=normalized, tools=tools, reply=reply)
            finish = "tool_calls" if calls else comp.finish_reason
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
                "finish_reason": finish,
                "logprobs": self._logprobs(comp.token_ids, comp.logprobs) if body.get("logprobs") else None,
            }
            if body.get("return_token_ids"):
                choice["token_ids"] = comp.token_ids
            choices.append(choice)
        return self._response("chat.completion", "chatcmpl", plan, replies, choices, body)

    async def _completion(self, body: Mapping[str, Any], episode: Any) -> dict[str, Any]:
        log = self._episode(episode)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        ok_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)
        if not (isinstance(prompt, str) and prompt) and not ok_ids:
            raise RequestError("prompt must be one non-empty string or one list of token ids", param="prompt")
        with log.lock:
            plan = log.plan_completion(self.tokenizer, prompt)
        body = {"max_tokens": 16, **body}  # the OpenAI default of /v1/completions
        request = self._request(body, log, plan.prompt_ids)
        replies = await self._generate(request)
        choices = []
        for index, comp in enumerate(replies):
            self._record(log, "completion", plan, comp)
            choice: dict[str, Any] = {
                "index": index,
                "text": comp.text,
                "finish_reason": comp.finish_reason,
                "logprobs": None,
            }
            if body.get("logprobs"):
                tokens = self.tokenizer.convert_ids_to_tokens(comp.token_ids)
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": comp.logprobs, "top_logprobs": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = comp.token_ids
            choices.append(choice)
        return self._response("text_completion", "cmpl", plan, replies, choices, body)

    def _record(self, log: EpisodeLog, kind: str, plan: PromptPlan, comp: Any, **chat: Any) -> None:
        call = CallRecord(
            kind=kind,
            context_text=plan.context_text,
            prompt_ids=list(plan.prompt_ids),
            token_ids=list(comp.token_ids),
            logprobs=list(comp.logprobs),
            text=comp.text,
            finish_reason=comp.finish_reason,
            policy_version=self.policy_version,
            parent=plan.parent,
            reformatted=plan.reformatted,
            **chat,
        )
        with log.lock:
            log.add(call)

    def _response(
        self, obj: str, prefix: str, plan: PromptPlan, replies: list[Any], choices: list[Any], body: Mapping[str, Any]
    ) -> dict[str, Any]:
        sampled = sum(len(c.token_ids) for c in replies)
        out: dict[str, Any] = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": choices,
            "usage": {
                "prompt_tokens": len(plan.prompt_ids),
                "completion_tokens": sampled,
                "total_tokens": len(plan.prompt_ids) + sampled,
            },
            "system_fingerprint": f"llmrl-policy-v{self.policy_version}",
        }
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = list(plan.prompt_ids)
        return out
