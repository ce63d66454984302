"""PythonInterpreter inside ChatEnv: TorchRL's message format, persistent and one-shot modes, masking."""

from __future__ import annotations

import sys
import time

import pytest
from transformers import AutoTokenizer

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.tools.python_interpreter import PythonInterpreter, extract_python_blocks


def block(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture
def make_env():
    made = []

    def factory(batch_size=2, **kwargs):
        interp = PythonInterpreter(timeout=3, **kwargs)
        env = ChatEnv(batch_size=batch_size, system_prompt="Use Python.")
        env.append_transform(interp)
        made.append(interp)
        return env, interp

    yield factory
    for interp in made:
        interp.close()


def tool_messages(history):
    """The tool messages' contents in one row of the env's ``("history", "prompt")``."""
    return [content for role, content in zip(history.role, history.content, strict=True) if role == "tool"]


def test_extract_python_blocks_follows_torchrl_fences():
    text = "a\n```python\nx = 1\n```\nb ```python\nprint(x)\n```\n```py\nignored\n```\n```python\nno close"
    assert extract_python_blocks(text) == ["x = 1", "print(x)"]


def test_messages_use_torchrl_wording_and_tool_role(make_env):
    env, _ = make_env(batch_size=1)
    env.reset(["compute"])
    out = env.step([f"Two blocks.\n{block('print(6 * 7)')}\nand\n{block('1 / 0')}"])
    history = out["history", "prompt"][0]
    assert history.role[-3:] == ["assistant", "tool", "tool"]
    assert history[-2].content == "Code block 1 executed successfully:\n42\n"
    assert history[-1].content.startswith("Code block 2 failed:\nTraceback (most recent call last):")
    assert history[-1].content.rstrip().endswith("ZeroDivisionError: division by zero")
    info = out["info"][0]
    assert info["num_tool_calls"] == 2 and info["tool_errors"] == 1
    assert [call["error"] for call in info["tool_calls"]] == [False, True]
    assert info["tool_calls"][0]["name"] == "python" and "6 * 7" in info["tool_calls"][0]["arguments"]


def test_no_code_no_message(make_env):
    env, _ = make_env(batch_size=1)
    env.reset(["hi"])
    out = env.step(["Just text, `inline` code and ```\nunlabelled fence\n```"])
    assert out["history", "prompt"][0].role[-1] == "assistant"


def test_persistent_state_survives_turns_and_is_reset_with_the_env(make_env):
    env, interp = make_env(persistent=True)
    env.reset(["a", "b"])
    env.step([block("x = 40"), block("x = 'slot one'")])
    out = env.step([block("x += 2\nprint(x)"), block("print(x)")])
    assert tool_messages(out["history", "prompt"][0])[-1] == "Code block 1 executed successfully:\n42\n"
    assert tool_messages(out["history", "prompt"][1])[-1] == "Code block 1 executed successfully:\nslot one\n"
    env.step([block("open('notes.txt', 'w').write('kept')"), block("pass")])
    out = env.step([block("print(open('notes.txt').read())"), block("pass")])
    assert tool_messages(out["history", "prompt"][0])[-1].endswith("kept\n")
    env.reset(["a", "b"])
    assert interp._sandboxes == {}
    out = env.step([block("print(x)"), block("print('fresh')")])
    assert "NameError: name 'x' is not defined" in tool_messages(out["history", "prompt"][0])[-1]


def test_one_shot_mode_keeps_nothing(make_env):
    env, interp = make_env(batch_size=1, persistent=False)
    env.reset(["a"])
    env.step([block("y = 5")])
    out = env.step([block("print(y)")])
    assert "NameError" in tool_messages(out["history", "prompt"][0])[-1]
    assert interp._sandboxes == {}


@pytest.mark.parametrize("persistent", [True, False])
def test_stderr_output_alone_is_not_a_failure(make_env, persistent):
    """Failure is the exception raised, not stderr (TorchRL's persistent mode counts any stderr as failure)."""
    env, _ = make_env(batch_size=1, persistent=persistent)
    env.reset(["a"])
    code = "import sys, warnings\nprint('note', file=sys.stderr)\nwarnings.warn('careful')\nprint(6 * 7)"
    out = env.step([block(code)])
    assert tool_messages(out["history", "prompt"][0])[-1] == "Code block 1 executed successfully:\n42\n"
    assert out["info"][0]["tool_errors"] == 0 and out["info"][0]["tool_calls"][-1]["error"] is False


def test_timeout_and_crash_are_reported_and_env_goes_on(make_env):
    env, _ = make_env(persistent=True)
    env.reset(["a", "b"])
    start = time.monotonic()
    out = env.step([block("while True:\n    pass"), block("import os\nos._exit(9)")])
    assert time.monotonic() - start < 8  # slots run concurrently
    loop_msg, crash_msg = tool_messages(out["history", "prompt"][0])[-1], tool_messages(out["history", "prompt"][1])[-1]
    assert loop_msg.startswith("Code block 1 failed:") and "wall-clock time limit exceeded (3 s)" in loop_msg
    assert crash_msg.startswith("Code block 1 failed:") and "exit status 9" in crash_msg
    assert "state was lost" in crash_msg
    out = env.step([block("print('on')"), block("print('back')")])
    assert tool_messages(out["history", "prompt"][0])[-1] == "Code block 1 executed successfully:\non\n"
    assert tool_messages(out["history", "prompt"][1])[-1].startswith("Code block 1 executed successfully:\nback\n")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="traceback carets are new in Python 3.11")
@pytest.mark.parametrize(
    "code,expression",
    [
        ("x = 1\ny = x + undefined_name", "undefined_name"),
        ("if True:\n    y = 2 + undefined_name", "undefined_name"),
    ],
)
def test_traceback_carets_align_on_the_last_line(make_env, code, expression):
    """The fenced block reaches the sandbox without a final newline; the carets still sit under the expression."""
    env, _ = make_env(batch_size=1)
    env.reset(["a"])
    out = env.step([block(code)])
    lines = tool_messages(out["history", "prompt"][0])[-1].splitlines()
    source_row = next(i for i, line in enumerate(lines) if line.strip() == code.splitlines()[-1].strip())
    source, carets = lines[source_row], lines[source_row + 1]
    assert set(carets.strip()) == {"^"}
    assert carets.index("^") == source.index(expression)
    assert len(carets.strip()) == len(expression)


def test_done_slots_are_left_alone(make_env):
    env, _ = make_env(batch_size=2)
    env.reset(["a", "b"])
    env.slots[1].terminate()
    out = env.step([block("print(1)"), None])
    assert tool_messages(out["history", "prompt"][0]) and not tool_messages(out["history", "prompt"][1])


def test_assistant_mask_excludes_tool_output(default_model_path):
    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    interp = PythonInterpreter(persistent=True, timeout=3)
    env = ChatEnv(batch_size=1, tokenizer=tokenizer, system_prompt="Use Python.")
    env.append_transform(interp)
    try:
        env.reset(["What is 6*7?"])
        env.step([f"Let me run it.\n{block('print(6 * 7)')}"])
        out = env.step(["The answer is 42."])
    finally:
        interp.close()
    assert out["history", "prompt"][0].role[-1] == "assistant"
    chat = env.slots[0].history.apply_chat_template(
        tokenizer, return_assistant_tokens_mask=True, add_generation_prompt=False
    )
    masked = tokenizer.decode(chat.input_ids[chat.assistant_masks.bool()])
    unmasked = tokenizer.decode(chat.input_ids[~chat.assistant_masks.bool()])
    assert "Code block 1 executed successfully" not in masked
    assert "Code block 1 executed successfully" in unmasked and "42" in unmasked
    assert "Let me run it." in masked and "The answer is 42." in masked


def test_it_is_torchrls_tool_transform_and_its_override_points_work():
    """A TorchRL user's subclass overriding ``_execute_python_code`` (TorchRL's dict) changes what the env adds."""
    from llmrl_core.envs.transforms import Transform
    from llmrl_core.envs.transforms.tools import ToolTransformBase

    class Echo(PythonInterpreter):
        def _execute_python_code(self, code, i):
            return {"success": i == 0, "stdout": f"ran {code!r}\n", "stderr": "refused\n", "returncode": 0}

    assert isinstance(PythonInterpreter(), ToolTransformBase) and isinstance(PythonInterpreter(), Transform)
    env = ChatEnv(batch_size=2).append_transform(Echo())
    env.reset(["a", "b"])
    out = env.step([block("x = 1"), block("y = 2")])
    assert tool_messages(out["history", "prompt"][0]) == ["Code block 1 executed successfully:\nran 'x = 1'\n"]
    assert tool_messages(out["history", "prompt"][1]) == ["Code block 1 failed:\nrefused\n"]
    assert out["info"][1]["tool_errors"] == 1 and out["info"][0]["tool_errors"] == 0
    clone = PythonInterpreter(persistent=True, timeout=2).clone()
    assert clone.persistent and clone.timeout == 2 and clone.parent is None


def test_persistent_interpreters_follow_their_slot_when_others_have_ended(make_env):
    """The list calls give the transforms the active slots only: row 0 of a step is then slot 1, whose interpreter
    (not slot 0's) runs its code; a partial reset discards the reset slot's interpreter only."""
    env, interp = make_env(batch_size=3, persistent=True)
    env.reset(["a", "b", "c"])
    env.step([block("x = 'zero'"), block("x = 'one'"), block("x = 'two'")])
    env.slots[0].terminate()
    out = env.step([None, block("print(x)"), block("print(x)")])
    assert tool_messages(out["history", "prompt"][1])[-1] == "Code block 1 executed successfully:\none\n"
    assert tool_messages(out["history", "prompt"][2])[-1] == "Code block 1 executed successfully:\ntwo\n"
    env.reset_slots([1], ["again"])
    assert sorted(interp._sandboxes) == [0, 2]
    out = env.step([None, block("print(x)"), block("print(x)")])
    assert "NameError" in tool_messages(out["history", "prompt"][1])[-1]
    assert tool_messages(out["history", "prompt"][2])[-1] == "Code block 1 executed successfully:\ntwo\n"


def test_an_ended_episode_runs_no_code(make_env):
    """The turn limit ended the episode with this answer: its code has no reader and does not run."""
    interp = PythonInterpreter(timeout=3)
    env = ChatEnv(batch_size=2, max_turns=2).append_transform(interp)
    try:
        env.reset(["a", "b"])
        out = env.step([block("print(1)"), "no code"])
        assert tool_messages(out["history", "prompt"][0]) and out["info"][0]["num_tool_calls"] == 1
        out = env.step([block("print(2)"), block("print(3)")])
        assert bool(out["done"].all())
        assert len(tool_messages(out["history", "prompt"][0])) == 1 and not tool_messages(out["history", "prompt"][1])
        assert out["info"][0]["num_tool_calls"] == 1 and "num_tool_calls" not in out["info"][1]
    finally:
        env.close()
