"""The OpenAI-compatible agent endpoint on a real engine, through the real ``openai`` client: ``/v1/models``,
chat and completions, episode ids, batching of concurrent calls, and the recorded exact tokens (the prefix rule
across turns, history rewrites, tool-call replies)."""

from __future__ import annotations

import json
import math
import threading

import pytest


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def endpoint(vllm_engine_fp32, tokenizer):
    from llmrl_core.agents import AgentEndpoint, SamplingPolicy

    server = AgentEndpoint(
        vllm_engine_fp32,
        tokenizer,
        model_name="smol",
        policy_version=7,
        sampling=SamplingPolicy(temperature=1.0, top_p=1.0, max_tokens=16, seed=3),
    )
    with server:
        yield server


@pytest.fixture
def client(endpoint):
    import httpx
    import openai

    return openai.OpenAI(
        base_url=endpoint.base_url, api_key="x", max_retries=0, http_client=httpx.Client(trust_env=False)
    )


def test_binds_localhost_and_lists_the_policy(endpoint, client):
    assert endpoint.base_url.startswith("http://127.0.0.1:")
    models = client.models.list().data
    assert [m.id for m in models] == ["smol"]
    assert models[0].model_extra["policy_version"] == 7


def test_chat_records_what_the_client_received(endpoint, client, tokenizer):
    reply = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=12,
        extra_body={"episode_id": "chat-1", "return_token_ids": True},
    )
    (call,) = endpoint.recorder.episodes["chat-1"].calls
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == call.token_ids
    assert tokenizer.decode(call.token_ids, skip_special_tokens=True) == choice.message.content
    assert 1 <= len(call.token_ids) <= 12 and len(call.logprobs) == len(call.token_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in call.logprobs)
    assert call.policy_version == 7 and call.finish_reason == choice.finish_reason
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a color."}], tokenize=False, add_generation_prompt=True
    )
    assert call.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert reply.usage.prompt_tokens == len(call.prompt_ids)


def test_completions_and_the_user_field(endpoint, client, tokenizer):
    out = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=8, user="comp-1", logprobs=1)
    (call,) = endpoint.recorder.episodes["comp-1"].calls
    assert call.kind == "completion" and out.choices[0].text == call.text
    assert tokenizer.decode(call.token_ids, skip_special_tokens=True) == out.choices[0].text
    assert out.choices[0].logprobs.token_logprobs == pytest.approx(call.logprobs)


def test_the_header_names_the_episode(endpoint, client):
    episode = client.with_options(default_headers={"X-Episode-Id": "hdr-1"})
    episode.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert len(endpoint.recorder.episodes["hdr-1"].calls) == 1


def test_concurrent_calls_run_as_one_batch(endpoint, client):
    before = len(endpoint.batcher.batch_sizes)
    barrier = threading.Barrier(6)
    errors = []

    def call(i: int) -> None:
        try:
            barrier.wait()
            client.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=8, user=f"conc-{i}"
            )
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    sizes = endpoint.batcher.batch_sizes[before:]
    assert sum(sizes) == 6 and max(sizes) > 1, sizes  # the engine took several pending requests at once


def test_turns_keep_the_exact_prefix_and_a_rewrite_starts_a_new_chain(endpoint, client):
    messages = [{"role": "user", "content": "Say a number."}]
    first = client.chat.completions.create(model="smol", messages=messages, max_tokens=10, user="turns")
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Another."}]
    client.chat.completions.create(model="smol", messages=messages, max_tokens=10, user="turns")
    log = endpoint.recorder.episodes["turns"]
    one, two = log.calls
    assert two.parent == 0 and not two.reformatted
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.token_ids)] == one.prompt_ids + one.token_ids
    row = log.to_row({"q": 1}, "p", "g", 0, 1.0)
    assert row.tokens.tolist() == two.prompt_ids + two.token_ids
    sampled = [t for t, m in zip(row.tokens.tolist(), row.policy_mask.tolist(), strict=True) if m]
    assert sampled == one.token_ids + two.token_ids
    assert row.sampler_log_probs.tolist() == pytest.approx(one.logprobs + two.logprobs)
    assert row.num_turns == 2 and row.info["history_rewritten"] is False

    rewritten = [{"role": "user", "content": "Say a number."}, {"role": "assistant", "content": "Forty-two."}]
    client.chat.completions.create(
        model="smol", messages=[*rewritten, {"role": "user", "content": "More."}], max_tokens=6, user="turns"
    )
    assert log.calls[2].parent is None
    row = log.to_row({}, "p", "g", 0, 0.0)
    assert row.info["history_rewritten"] is True and row.info["agent_calls_trained"] == 1


def test_tool_call_replies_keep_the_sampled_ids(tokenizer):
    """A tool-call reply that the template renders otherwise than it was sampled still continues its chain."""
    from llmrl_core.agents.chat import parse_tool_calls
    from llmrl_core.agents.recorder import CallRecord, EpisodeLog

    log = EpisodeLog("tools")
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "What is 2+3?"}]
    plan = log.plan_chat(tokenizer, messages, tools)
    text = '<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
    sampled = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    content, calls = parse_tool_calls(text)
    assert content is None and calls[0]["function"]["name"] == "calc"
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2+3"}
    reply = {"role": "assistant", "content": "", "tool_calls": calls}
    log.add(
        CallRecord(
            "chat",
            plan.context_text,
            plan.prompt_ids,
            sampled,
            [-0.5] * len(sampled),
            text,
            "stop",
            0,
            messages=messages,
            tools=tools,
            reply=reply,
        )
    )
    follow = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"},
    ]
    nxt = log.plan_chat(tokenizer, follow, tools)
    assert nxt.parent == 0 and nxt.reformatted
    assert nxt.prompt_ids[: len(plan.prompt_ids) + len(sampled)] == plan.prompt_ids + sampled
    rendered_tail = tokenizer.decode(nxt.prompt_ids[len(plan.prompt_ids) + len(sampled) :])
    assert rendered_tail.startswith("\n<|im_start|>tool\n5<|im_end|>") and rendered_tail.endswith("assistant\n")


def test_a_streaming_client_gets_the_recorded_reply(endpoint, client, tokenizer):
    """stream=True (chat with n=2 and usage, completions): the chunks an openai client reads add up to the reply the
    rollout recorded, with its finish reason; an error still comes before any chunk, as a status."""
    import openai

    chunks = list(
        client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": "Name a fruit."}],
            max_tokens=10,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            extra_body={"episode_id": "stream-1"},
        )
    )
    calls = endpoint.recorder.episodes["stream-1"].calls
    assert len(calls) == 2
    for index, call in enumerate(calls):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.delta.content or "" for c in mine) == call.text
        assert mine[0].delta.role == "assistant" and [c.finish_reason for c in mine][-1] == call.finish_reason
        assert [t.logprob for t in mine[0].logprobs.content] == pytest.approx(call.logprobs)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sum(len(c.token_ids) for c in calls)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)

    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=6, stream=True, user="stream-2")
    )
    (call,) = endpoint.recorder.episodes["stream-2"].calls
    assert text == call.text and call.kind == "completion"
    with pytest.raises(openai.BadRequestError, match="n must be an integer"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], n=99, stream=True, user="stream-3"
        )


def test_streamed_tool_calls_are_deltas_with_an_index():
    """A reply with tool calls streams them as the OpenAI format does: one delta per call with its index."""
    import json as _json

    from llmrl_core.agents.streaming import stream_events

    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    response = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    events = list(stream_events(response, {}))
    assert events[-1] == "data: [DONE]\n\n" and len(events) == 3  # no usage chunk unless asked for
    first, last = (_json.loads(e.removeprefix("data: ")) for e in events[:2])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "tool_calls": [{"index": 0, **call}]}
    assert last["choices"][0]["finish_reason"] == "tool_calls" and last["choices"][0]["delta"] == {}


def test_the_responses_api_is_the_chat_call_it_translates_to(endpoint, client):
    """POST /v1/responses through the openai client: the output text is the recorded chat call's reply, a reply cut
    at max_output_tokens is "incomplete", and the streamed form ends with the same response."""
    import openai

    reply = client.responses.create(
        model="smol",
        instructions="Answer at length.",
        input="Tell a long story about a dragon.",
        max_output_tokens=4,
        extra_body={"episode_id": "resp-1"},
    )
    (call,) = endpoint.recorder.episodes["resp-1"].calls
    assert call.kind == "chat" and call.messages[0] == {"role": "system", "content": "Answer at length."}
    assert reply.output_text == call.text and reply.usage.output_tokens == len(call.token_ids) == 4
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    events = list(
        client.responses.create(
            model="smol",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
            stream=True,
            extra_body={"episode_id": "resp-2"},
        )
    )
    (call,) = endpoint.recorder.episodes["resp-2"].calls
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == call.text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with pytest.raises(openai.BadRequestError, match="keeps no responses"):
        client.responses.create(model="smol", input="x", previous_response_id="resp_1", user="resp-3")


def test_responses_input_items_become_the_chat_messages():
    """instructions, messages with text parts, function calls (joined to their turn's assistant message) and
    their outputs, function tools and a named tool choice; other item, part and tool types are refused."""
    from llmrl_core.agents.request_error import RequestError
    from llmrl_core.agents.responses_api import chat_body_from_responses

    tool = {"type": "function", "name": "add", "description": "Add.", "parameters": {"type": "object"}}
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "2+3?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"b": 3}'},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
        ],
        "tools": [tool],
        "tool_choice": {"type": "function", "name": "add"},
        "max_output_tokens": 9,
        "temperature": 0.5,
    }
    chat = chat_body_from_responses(body)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"b": 3}'}},
    ]
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["max_tokens"] == 9 and chat["temperature"] == 0.5 and chat["model"] == "m"
    for bad, message in [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
        ({"input": [{"type": "web_search_call"}]}, "item type 'web_search_call'"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "function tools only"),
        ({"input": []}, "input must be a non-empty"),
    ]:
        with pytest.raises(RequestError, match=message):
            chat_body_from_responses(bad)


def test_settings_that_would_reshape_sampling_are_accepted_counted_and_named_once(endpoint, client, caplog):
    """An agent written for OpenAI may ask for JSON mode, a forced tool, penalties or top log-probs: the call is
    served (sampling stays what the trainer scores), every such call is counted by setting, and the first of each
    kind is logged with the reason. The Responses API's text.format counts as response_format; completions count
    too."""
    import logging

    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    before = dict(endpoint.ignored)
    with caplog.at_level(logging.WARNING, logger="llmrl.agents"):
        for i in range(2):
            reply = client.chat.completions.create(
                model="smol",
                messages=[{"role": "user", "content": "2+3?"}],
                max_tokens=4,
                response_format={"type": "json_object"},
                tools=[tool],
                tool_choice="required",
                presence_penalty=0.5,
                logprobs=True,
                top_logprobs=2,
                user=f"ignored-{i}",
            )
            assert reply.choices[0].logprobs.content[0].top_logprobs == []
        client.chat.completions.create(  # text, auto and zero penalties change nothing: not counted
            model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=2, response_format={"type": "text"},
            tools=[tool], tool_choice="auto", frequency_penalty=0, user="ignored-none",
        )  # fmt: skip
        client.responses.create(
            model="smol", input="hi", max_output_tokens=2, text={"format": {"type": "json_object"}}, user="ignored-r"
        )
        client.completions.create(model="smol", prompt="2+3=", max_tokens=2, logit_bias={"42": -100}, user="ignored-c")
    counted = {k: v - before.get(k, 0) for k, v in endpoint.ignored.items() if v - before.get(k, 0)}
    assert counted == {
        "response_format": 3, "tool_choice": 2, "presence_penalty": 2, "top_logprobs": 2, "logit_bias": 1
    }  # fmt: skip
    warned = [r.getMessage() for r in caplog.records if r.name == "llmrl.agents"]
    assert len(warned) == sum(1 for k in counted if not before.get(k))  # once per setting per endpoint
    if not before.get("response_format"):
        assert any("sets response_format, which has no effect here (no constrained decoding" in m for m in warned)


def test_ignored_settings_by_hand():
    from llmrl_core.agents.ignored_settings import ignored_settings
    from llmrl_core.agents.rollout import AgentRollout

    assert ignored_settings({"tool_choice": "required"}) == []  # no tools: nothing to force
    assert ignored_settings({"tools": [{}], "tool_choice": {"type": "function", "function": {"name": "f"}}}) == [
        "tool_choice"
    ]
    assert ignored_settings({"logit_bias": {"5": -100}, "top_logprobs": 3}) == ["logit_bias"]  # no logprobs asked
    assert AgentRollout([], [], [], {"logit_bias": 4}).metrics()["agent_ignored_logit_bias"] == 4.0


def test_refusals_are_openai_errors(endpoint, client):
    import openai

    with pytest.raises(openai.BadRequestError, match="stream must be true or false"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], user="s", extra_body={"stream": "yes"}
        )
    endpoint.recorder.open_only = True
    try:
        with pytest.raises(openai.APIStatusError, match="unknown episode"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], user="nobody")
        endpoint.recorder.open("done")
        endpoint.recorder.close("done")
        with pytest.raises(openai.APIStatusError, match="is over"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], user="done")
    finally:
        endpoint.recorder.open_only = False


def test_stored_messages_map_openai_roles_and_refuse_the_rest():
    from llmrl_core.agents.recorder import stored_messages

    stored = stored_messages(
        [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "assistant"}]
    )
    assert stored == [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": ""}]
    with pytest.raises(ValueError, match=r"messages\[0\]: role 'narrator'"):
        stored_messages([{"role": "narrator", "content": "x"}])


def test_completion_calls_continue_by_text_or_by_ids(tokenizer):
    from llmrl_core.agents.recorder import CallRecord, EpisodeLog

    log = EpisodeLog("comp")
    first = log.plan_completion(tokenizer, "Once upon")
    sampled = tokenizer.encode(" a time", add_special_tokens=False)
    log.add(
        CallRecord(
            "completion", first.context_text, first.prompt_ids, sampled, [-1.0] * len(sampled), " a time", "length", 0
        )
    )
    by_text = log.plan_completion(tokenizer, "Once upon a time, there")
    assert by_text.parent == 0
    assert by_text.prompt_ids[: len(first.prompt_ids) + len(sampled)] == first.prompt_ids + sampled
    by_ids = log.plan_completion(tokenizer, [*first.prompt_ids, *sampled, 11])
    assert by_ids.parent == 0 and by_ids.prompt_ids[-1] == 11
    assert log.plan_completion(tokenizer, "Twice upon a time").parent is None


def test_the_readme_agent_runs_against_the_endpoint(endpoint):
    """docs/environments.md "Bring your environment", route 2: the agent as printed, a plain openai client, a real
    engine."""
    import re
    from pathlib import Path

    import httpx
    import openai

    readme = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    section = readme[readme.index("**2. Any agent that talks to an OpenAI-compatible endpoint**") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "llmrl" not in code.split("->")[-1].split("\n", 1)[1]  # no llmrl import in the agent
    namespace: dict = {}
    exec(compile(code, "docs/environments.md", "exec"), namespace)
    client = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key="x",
        max_retries=0,
        default_headers={"X-Episode-Id": "readme-1"},
        http_client=httpx.Client(trust_env=False),
    )
    reward = namespace["solve"]({"query": "What is 12 + 30?", "answer": "#### 42"}, client)
    assert reward in (0.0, 1.0)
    calls = endpoint.recorder.episodes["readme-1"].calls
    assert 1 <= len(calls) <= 3 and all(c.token_ids for c in calls)
