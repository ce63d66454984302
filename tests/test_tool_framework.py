"""TorchRL's generic tool framework (``llmrl_core.envs.transforms.tools``): the parsers, ``SimpleToolTransform`` and
``ExecuteToolsInOrder`` give what TorchRL 0.14.1 gives (``api_probes.json`` ``tool_framework``, the same probe run
there), and run on llmrl's list calls in tokens mode too, where the flows drive an env."""

from __future__ import annotations

import time

import pytest
from tensordict import TensorDict

from llmrl_core.data.history import History
from llmrl_core.data.llm_data import Response
from llmrl_core.envs import ChatEnv, GSM8KRewardParser
from llmrl_core.envs.transforms import tools
from llmrl_core.envs.transforms.tools import SimpleToolTransform, ToolTransformBase
from llmrl_core.modules.policies.common import ChatHistory, Text
from tests.torchrl_layout_probes import library, tool_framework


def test_the_tool_framework_answers_as_torchrls(default_model_path):
    """Parsers' text/calls/meta, the next prompt after one step of each transform (TorchRL's ``"<none>"`` padding
    included), the registry's and ``use_step``'s errors: equal to TorchRL's record."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    api = library(ChatEnv, History, ChatHistory, Text, GSM8KRewardParser, tools=tools)
    ours = tool_framework(api, AutoTokenizer.from_pretrained(default_model_path))
    golden = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())["tool_framework"]
    assert json.loads(json.dumps(ours)) == golden
    assert golden["simple"]["roles"][1] == ["user", "assistant", "tool", "tool", "tool"]


def _calculator(operation: str, a: float, b: float) -> dict:
    return {"result": a + b} if operation == "add" else {"error": operation}


def test_a_simple_tool_in_a_tokens_mode_env_adds_its_output_to_the_next_prompt(default_model_path):
    """The flows' call (tokens mode, list steps): the slot that called the tool gets its result as a ``tool``
    message (no ``"<none>"`` padding in its conversation), its next prompt's ids render it; the other slot's next
    prompt is the plain next turn."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    env = ChatEnv(tokenizer=tokenizer, input_mode="tokens", max_turns=3, batch_size=2)
    env.append_transform(SimpleToolTransform(tools={"calculator": _calculator}))
    env.reset(["What is 2 + 3?", "Hello"])
    call = '<tool>calculator\n{"operation": "add", "a": 2, "b": 3}</tool><|im_end|>'
    out = env.step([Response(call), Response("Hi!<|im_end|>")])
    assert out["history", "prompt"][0].role == ["user", "assistant", "tool"]
    assert out["history", "prompt"][0][-1].content == "Tool calculator executed successfully:\n{'result': 5}"
    assert out["history", "prompt"][1].role == ["user", "assistant"]
    for slot, ids in zip(env.slots, out.get(("tokens", "prompt"), as_list=True), strict=True):
        assert tokenizer.decode(ids.tolist()) == env._render(slot.history, add_generation_prompt=True)


def test_a_tool_that_does_not_answer_in_time_is_a_failed_call():
    slow = SimpleToolTransform(tools={"sleep": lambda seconds: time.sleep(seconds)}, timeout=0.2)
    start = time.monotonic()
    result = slow._execute_tool("sleep", '{"seconds": 5}')
    assert time.monotonic() - start < 2
    assert result == {"success": False, "error": "Tool execution failed: no answer within 0.2 s"}


def test_a_tool_transform_outside_an_env_or_without_a_history_says_so():
    class Echo(ToolTransformBase):
        def _process_batch_item(self, content, index):
            return [content]

    echo = Echo()
    with pytest.raises(RuntimeError, match="Echo must be used with a ChatEnv"):
        echo._step(TensorDict(), TensorDict(batch_size=(1,)))
    env = ChatEnv(input_mode="text", batch_size=1, chat_template_name="chatml").append_transform(echo)
    td = env.reset(TensorDict({"query": ["hi"]}, batch_size=(1,)))
    td.set("text", Text(prompt=list(td["text", "prompt"]), response=["yo<|im_end|>"], batch_size=(1,)))
    with pytest.raises(RuntimeError, match="in history mode"):
        env.step(td)
    with pytest.raises(NotImplementedError, match="must implement _process_batch_item"):
        ToolTransformBase()._process_batch_item("x", 0)
