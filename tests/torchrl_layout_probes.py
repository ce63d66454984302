"""Step-layout probes run the same way on TorchRL and on llmrl: each takes the library's classes (``api``: an object
with ``ChatEnv``, ``History``, ``ChatHistory``, ``Text`` and ``GSM8KRewardParser``) and a tokenizer, steps an env and
records what it wrote. ``scripts/torchrl_goldens.py`` runs them on TorchRL 0.14.1 (side venv) into
``goldens/torchrl/api_probes.json``; the tests run them on llmrl and compare. Needs only ``torch`` and
``tensordict`` besides the library passed in."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader


def _next_record(nxt: Any, values: bool) -> dict[str, Any]:
    tensors = {}
    for key in sorted(nxt.keys(True, True), key=str):
        tensor = nxt[key]
        tensors[str(key)] = [list(tensor.shape), str(tensor.dtype), *([tensor.tolist()] if values else [])]
    return {"next_keys": sorted(nxt.keys()), "next_tensors": tensors}


def reset_layout(api: Any, tokenizer: Any) -> dict[str, Any]:
    """``env.reset()`` (no argument) on a ``ChatEnv`` of batch size 2 fed by a DataLoader, in history and text modes:
    the TensorDict's type, batch size, keys, tensors' shapes and dtypes, the rows' queries, the prompt's roles (history
    mode) or text (text mode)."""
    out: dict[str, Any] = {}
    for mode in ("history", "text"):
        prompts = DataLoader([{"query": f"Say {i}."} for i in range(4)], batch_size=2)
        env = api.ChatEnv.from_dataloader(prompts, tokenizer=tokenizer, batch_size=(2,), input_mode=mode)
        td = env.reset()
        record: dict[str, Any] = {
            "type": type(td).__name__,
            "batch_size": list(td.batch_size),
            "keys": sorted(td.keys()),
            "tensors": {str(k): [list(td[k].shape), str(td[k].dtype)] for k in sorted(td.keys(True, True), key=str)},
            "query": list(td["query"]),
        }
        if mode == "history":
            prompt = td["history"].prompt
            record["history_type"] = type(td["history"]).__name__
            record["prompt_roles"] = [list(prompt[i].role) for i in range(2)]
        else:
            record["prompt_text"] = list(td["text", "prompt"])
        out[mode] = record
    return out


def step_layout(api: Any, tokenizer: Any) -> dict[str, Any]:
    """A bare ``ChatEnv`` (batch size 2, no transform) stepped once, in history and text modes: the keys at the top
    and under ``"next"``, the tensors' shapes and dtypes, and the next prompt."""
    out: dict[str, Any] = {}
    for mode in ("history", "text"):
        env = api.ChatEnv(input_mode=mode, batch_size=(2,), tokenizer=tokenizer, system_prompt="Be brief.")
        td = env.reset(TensorDict({"query": ["Say 0.", "Say 1."]}, batch_size=(2,)))
        if mode == "history":
            answers = api.History(role=[["assistant"], ["assistant"]], content=[["0"], ["1"]], batch_size=(2, 1))
            full = td["history"].prompt.extend(answers, inplace=False, dim=-1)
            td.set("history", api.ChatHistory(prompt=td["history"].prompt, full=full, batch_size=(2,)))
        else:
            prompts = list(td["text", "prompt"])
            full = [prompt + f"{i}<|im_end|>" for i, prompt in enumerate(prompts)]
            td.set("text", api.Text(prompt=prompts, full=full, batch_size=(2,)))
        stepped = env.step(td)
        nxt = stepped["next"]
        record = {"keys": sorted(stepped.keys()), **_next_record(nxt, values=False)}
        if mode == "history":
            prompt = nxt["history"].prompt
            record["next_history_type"] = type(nxt["history"]).__name__
            record["next_prompt_roles"] = [list(prompt[i].role) for i in range(2)]
            record["next_prompt_content"] = [list(prompt[i].content) for i in range(2)]
        else:
            record["next_prompt_text"] = list(nxt["text", "prompt"])
        out[mode] = record
    return out


def _answer_once(api: Any, env: Any, answers: list[str]) -> Any:
    """Reset a history-mode env of two slots, answer each with its text, step once: the step's ``"next"`` data."""
    td = env.reset()
    response = api.History(role=[["assistant"]] * len(answers), content=[[a] for a in answers], batch_size=(2, 1))
    full = td["history"].prompt.extend(response, inplace=False, dim=-1)
    td.set("history", api.ChatHistory(prompt=td["history"].prompt, full=full, response=response, batch_size=(2,)))
    return env.step(td)["next"]


def reward_parser_layout(api: Any, tokenizer: Any) -> tuple[dict[str, Any], Any]:
    """``ChatEnv.from_dataloader`` with ``GSM8KRewardParser`` appended, stepped once with a right answer (with its
    reasoning) and a wrong one (without): the keys under ``"next"`` and each tensor's shape, dtype and values, and
    the rows' answers carried there. Also returns the env (the tests look at its slots)."""
    rows = [{"query": "2+2?", "answer": "so #### 4"}, {"query": "3+3?", "answer": "so #### 6"}]
    loader = DataLoader(rows, batch_size=2, collate_fn=lambda batch: {k: [r[k] for r in batch] for k in batch[0]})
    env = api.ChatEnv.from_dataloader(loader, tokenizer=tokenizer, batch_size=(2,), input_mode="history")
    env = env.append_transform(api.GSM8KRewardParser(tokenizer=tokenizer))
    nxt = _answer_once(api, env, ["<think>x</think> <answer>4</answer>", "<answer>5</answer>"])
    return {**_next_record(nxt, values=True), "next_answer": list(nxt["answer"])}, env


REWARD_PARSER_DONE_ANSWERS = (
    "The answer is 4.",
    "<answer></answer>",
    "<answer>4",
    "<ANSWER>4</ANSWER>",
    "<answer>5</answer>",
    "<think>so</think> <answer>4</answer>",
)


def reward_parser_done(api: Any, tokenizer: Any) -> dict[str, Any]:
    """``GSM8KRewardParser`` on a history-mode ``ChatEnv``, stepped once per answer of ``REWARD_PARSER_DONE_ANSWERS``
    (no tag, an empty, unclosed or upper-case tag, a wrong and a right answer), without a turn limit and with a
    limit of one turn (``api.limit_turns(env, 1)``: TorchRL's ``StepCounter``, llmrl's ``max_turns``): each answer's
    ``done`` / ``terminated`` and ``reward`` under ``"next"``. Without a limit only a valid answer tag ends the
    episode (a multi-turn episode may continue)."""
    out: dict[str, Any] = {}
    for limit in (None, 1):
        record = out[f"max_turns={limit}"] = {}
        for answer in REWARD_PARSER_DONE_ANSWERS:
            rows = [{"query": "2+2?", "answer": "so #### 4"}] * 2
            loader = DataLoader(rows, batch_size=2, collate_fn=lambda b: {k: [r[k] for r in b] for k in b[0]})
            env = api.ChatEnv.from_dataloader(loader, tokenizer=tokenizer, batch_size=(2,), input_mode="history")
            if limit is not None:
                env = api.limit_turns(env, limit)
            env = env.append_transform(api.GSM8KRewardParser(tokenizer=tokenizer))
            nxt = _answer_once(api, env, [answer, answer])
            record[answer] = {key: nxt[key].flatten().tolist() for key in ("done", "terminated", "reward")}
    return out


def ifeval_scorer_layout(api: Any, tokenizer: Any) -> dict[str, Any]:
    """``ChatEnv.from_dataloader`` with ``IfEvalScorer`` appended, stepped once with an answer that follows its
    instruction (lowercase, in an answer block, with reasoning) and one that does not: the keys under ``"next"``,
    each plain tensor's shape, dtype and values, and the score's fields."""
    rows = [
        {
            "key": 1,
            "text": "Write a greeting in lowercase letters only.",
            "instruction_id_list": ["change_case:english_lowercase"],
            "kwargs": [{}],
        },
        {
            "key": 2,
            "text": "Write a greeting in lowercase letters only.",
            "instruction_id_list": ["change_case:english_lowercase"],
            "kwargs": [{}],
        },
    ]

    def collate(batch: list[dict[str, Any]]) -> TensorDict:  # as TorchRL's IFEval loader: lists stay lists
        out = TensorDict(key=torch.tensor([r["key"] for r in batch]), text=[r["text"] for r in batch], batch_size=[2])
        for field in ("instruction_id_list", "kwargs"):
            out.set(field, NonTensorStack(*(NonTensorData(r[field]) for r in batch)))
        return out

    loader = DataLoader(rows, batch_size=2, collate_fn=collate)
    env = api.ChatEnv.from_dataloader(
        loader, tokenizer=tokenizer, batch_size=(2,), input_mode="history", data_key="text"
    )
    env = env.append_transform(api.IfEvalScorer())
    nxt = _answer_once(
        api, env, ["<think>be quiet</think> <answer>hello there</answer>", "<answer>HELLO THERE</answer>"]
    )
    plain = nxt.exclude("ifeval_score")
    score = nxt["ifeval_score"]
    fields = {}
    for key in sorted(score.keys(True, True), key=str):
        value = score.get(key)
        fields[str(key)] = [list(value.shape), str(value.dtype), value.tolist()]
    return {
        **_next_record(plain, values=True),
        "next_keys": sorted(nxt.keys()),
        "score_type": type(score).__name__,
        "score_fields": fields,
    }


def _layout(td: Any) -> dict[str, Any]:
    """Each leaf of ``td``: ``[shape, dtype]`` for a tensor, ``"ragged"`` where rows differ in length, else its
    type's name."""
    out: dict[str, Any] = {}
    for key in sorted(td.keys(True, True), key=str):
        try:
            value = td.get(key)
        except RuntimeError:  # rows of different lengths
            out[str(key)] = "ragged"
            continue
        out[str(key)] = [list(value.shape), str(value.dtype)] if hasattr(value, "dtype") else type(value).__name__
    return out


def collector_rows_layout(api: Any, model: Any, tokenizer: Any) -> dict[str, Any]:
    """``LLMCollector`` over ``ChatEnv.from_dataloader`` (batch size 2, a system prompt) with ``GSM8KRewardParser``,
    a greedy ``TransformersWrapper`` (6 new tokens, log-probs), 4 dialog turns per batch; in history and text
    modes: the first batch's size and each entry's shape and dtype."""
    out: dict[str, Any] = {}
    for mode in ("history", "text"):
        rows = [{"query": f"What is {i}+{i}?", "answer": f"#### {2 * i}"} for i in range(8)]
        loader = DataLoader(rows, batch_size=2, collate_fn=lambda b: {k: [r[k] for r in b] for k in b[0]})
        env = api.ChatEnv.from_dataloader(
            loader, tokenizer=tokenizer, batch_size=(2,), input_mode=mode, system_prompt="Answer in <answer></answer>."
        )
        env = env.append_transform(api.GSM8KRewardParser(tokenizer=tokenizer))
        policy = api.TransformersWrapper(
            model,
            tokenizer=tokenizer,
            input_mode=mode,
            generate=True,
            return_log_probs=True,
            generate_kwargs={"max_new_tokens": 6, "do_sample": False},
        )
        collector = api.LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8)
        batch = next(iter(collector))
        out[mode] = {"batch_size": list(batch.batch_size), "entries": _layout(batch)}
    return out


def template_choice(api: Any, tokenizer: Any) -> dict[str, str]:
    """The prompt a ``ChatEnv`` renders at reset in text and tokens modes (tokens decoded), with and without a system
    prompt, for each way TorchRL lets a user pick the template (none: its automatic choice; ``template_kwargs`` with
    ``chat_template_name`` or ``chat_template``), and for a tokenizer whose name says Qwen (its family rule)."""
    import copy

    qwen = copy.copy(tokenizer)
    qwen.name_or_path = "probe/Qwen2.5-0.5B-Instruct"
    choices: list[tuple[str, Any, dict[str, Any] | None]] = [
        ("auto", tokenizer, None),
        ("named chatml_format", tokenizer, {"chat_template_name": "chatml_format"}),
        ("named qwen", tokenizer, {"chat_template_name": "qwen"}),
        ("the tokenizer's own", tokenizer, {"chat_template": tokenizer.chat_template}),
        ("auto, a qwen tokenizer", qwen, None),
    ]
    out: dict[str, str] = {}
    for label, tok, template_kwargs in choices:
        for mode in ("text", "tokens"):
            for system_prompt in (None, "Be brief."):
                env = api.ChatEnv(
                    batch_size=(1,),
                    tokenizer=tok,
                    input_mode=mode,
                    template_kwargs=template_kwargs,
                    system_prompt=system_prompt,
                )
                td = env.reset(TensorDict(query=["Name a color."], batch_size=(1,)))
                if mode == "text":
                    prompt = td["text", "prompt"][0]
                else:
                    prompt = tokenizer.decode(td.get(("tokens", "prompt"), as_list=True)[0].tolist())
                out[f"{label} | {mode} | system={system_prompt}"] = prompt
    return out


def tool_transform_turns(api: Any, tokenizer: Any) -> dict[str, Any]:
    """A user's tool written as TorchRL writes one (a TensorDict transform whose ``_step`` reads the answer at the end
    of ``("history", "prompt")`` under ``"next"`` and extends that history with a ``tool`` message, as TorchRL's tool
    transforms do) on a history-mode ``ChatEnv`` of two slots, answered twice through ``step_and_maybe_reset``: the
    roles and contents of the next prompt after each turn, and the second one rendered with the chat template."""

    class Adder(api.Transform):
        """Answers "add A B" with the sum as a tool message; other answers get none."""

        def _step(self, tensordict: Any, next_tensordict: Any) -> Any:
            history = next_tensordict["history"].prompt
            answers = [history[i, -1].content for i in range(history.batch_size[0])]
            sums = [sum(int(n) for n in a.split()[1:]) if a.startswith("add") else None for a in answers]
            if all(value is None for value in sums):
                return next_tensordict
            tool = api.History(role=[["tool"]] * len(sums), content=[[f"{v}"] for v in sums], batch_size=(len(sums), 1))
            history.extend(tool, dim=-1)
            next_tensordict["history"].prompt = history
            return next_tensordict

    env = api.ChatEnv(input_mode="history", batch_size=(2,), tokenizer=tokenizer, system_prompt="Use the adder.")
    env = env.append_transform(Adder())
    td = env.reset(TensorDict({"query": ["What is 2 + 3?", "What is 4 + 5?"]}, batch_size=(2,)))
    out: dict[str, Any] = {}
    for turn, answers in enumerate((["add 2 3", "add 4 5"], ["It is 5.", "It is 9."])):
        response = api.History(role=[["assistant"]] * 2, content=[[a] for a in answers], batch_size=(2, 1))
        full = td["history"].prompt.extend(response, inplace=False, dim=-1)
        td.set("history", api.ChatHistory(prompt=td["history"].prompt, full=full, response=response, batch_size=(2,)))
        stepped, td = env.step_and_maybe_reset(td)
        prompt = td["history"].prompt
        out[f"turn {turn}"] = {
            "next_roles": [list(stepped["next", "history"].prompt[i].role) for i in range(2)],
            "next_contents": [list(stepped["next", "history"].prompt[i].content) for i in range(2)],
            "prompt_roles": [list(prompt[i].role) for i in range(2)],
            "prompt_contents": [list(prompt[i].content) for i in range(2)],
        }
    out["rendered"] = list(td["history"].prompt.apply_chat_template(tokenizer=tokenizer, add_generation_prompt=True))
    return out


def _parse_record(result: Any) -> dict[str, Any]:
    calls = [[call.tool, call.args, call.tag] for call in result["calls"]]
    return {"text": result["text"], "calls": calls, "meta": result["meta"]}


def tool_framework(api: Any, tokenizer: Any) -> dict[str, Any]:
    """TorchRL's generic tool framework (``api.tools``: its ``tools`` module): the two parsers on sample answers, and
    ``SimpleToolTransform`` (its default pattern, and ``XMLBlockParser``) and ``ExecuteToolsInOrder`` (a registry
    with a failing service, ``stop_on_error`` both ways) each on a history-mode ``ChatEnv`` of three slots stepped
    once: the next prompt's roles and contents (with TorchRL's ``"<none>"`` padding), and the errors it documents."""
    tools = api.tools
    out: dict[str, Any] = {}
    xml, js = tools.XMLBlockParser(), tools.JSONCallParser()
    out["xml"] = [
        _parse_record(xml(text))
        for text in (
            '<tool name="search" tag="A">{"query": "torchrl"}</tool>\nSome text.',
            'Before <tool name="echo">not json</tool> middle <tool name="noop"></tool> after',
            {"text": '<tool name="x">{"a": 1}</tool>'},
            "no tools here",
        )
    ]
    out["json"] = [
        _parse_record(js(value))
        for value in (
            {"message": "Searching.", "tools": [{"tool": "search", "args": {"query": "q"}, "tag": "A"}]},
            '{"message": "m", "tools": [{"tool": "t", "args": {}}]}',
            "plain text",
        )
    ]

    def calculator(operation: str, a: float, b: float) -> Any:
        if operation == "add":
            return {"result": a + b}
        if operation == "div":
            return {"result": a / b}
        return {"error": "unknown operation"}

    class Add:
        name, schema_in, schema_out = "add", {"a": int, "b": int}, {"result": int}

        def __call__(self, a: int, b: int, **kwargs: Any) -> dict[str, Any]:
            return {"result": a + b, "state_keys": sorted(kwargs)}

    class Broken:
        name, schema_in, schema_out = "broken", {}, {}

        def __call__(self, **kwargs: Any) -> dict[str, Any]:
            raise ValueError("the service is down")

    def step_once(transform: Any, answers: list[str]) -> dict[str, Any]:
        env = api.ChatEnv(input_mode="history", batch_size=(3,), tokenizer=tokenizer).append_transform(transform)
        td = env.reset(TensorDict({"query": ["q0", "q1", "q2"]}, batch_size=(3,)))
        response = api.History(role=[["assistant"]] * 3, content=[[a] for a in answers], batch_size=(3, 1))
        full = td["history"].prompt.extend(response, inplace=False, dim=-1)
        td.set("history", api.ChatHistory(prompt=td["history"].prompt, full=full, response=response, batch_size=(3,)))
        prompt = env.step(td)["next", "history"].prompt
        return {
            "roles": [list(prompt[i].role) for i in range(3)],
            "contents": [list(prompt[i].content) for i in range(3)],
        }

    calls = [
        '<tool>calculator\n{"operation": "add", "a": 2, "b": 3}</tool>',
        'Two: <tool>calculator\n{"operation": "div", "a": 1, "b": 0}</tool> <tool>nope\n{}</tool>'
        " <tool>calculator\n{bad json}</tool>",
        "No call.",
    ]
    out["simple"] = step_once(tools.SimpleToolTransform(tools={"calculator": calculator}), calls)
    xml_calls = [
        '<tool name="calculator">{"operation": "add", "a": 1, "b": 1}</tool>',
        "No call.",
        '<tool name="calculator" tag="t">{"operation": "mul", "a": 1, "b": 1}</tool>',
    ]
    out["simple_xml"] = step_once(
        tools.SimpleToolTransform(tools={"calculator": calculator}, parser=tools.XMLBlockParser()), xml_calls
    )
    ordered = [
        '<tool name="add" tag="first">{"a": 1, "b": 2}</tool> then <tool name="broken">{}</tool>'
        ' then <tool name="add">{"a": 3, "b": 4}</tool>',
        '<tool name="missing">{}</tool>',
        "No call.",
    ]
    for stop in (False, True):
        registry = tools.ToolRegistry([Add()])
        registry.register(Broken())
        transform = tools.ExecuteToolsInOrder(registry=registry, parser=tools.XMLBlockParser(), stop_on_error=stop)
        out[f"in_order stop_on_error={stop}"] = step_once(transform, ordered)
    registry = tools.ToolRegistry([Add()])
    out["registry"] = {"contains": ["add" in registry, "broken" in registry]}
    try:
        registry.get("broken")
    except KeyError as err:
        out["registry"]["error"] = [type(err).__name__, str(err)]
    off = tools.SimpleToolTransform(tools={})
    off.use_step = False
    try:
        off._step(TensorDict(), TensorDict())
    except RuntimeError as err:
        out["use_step_error"] = str(err)
    return out


def _spec_record(spec: Any) -> dict[str, Any]:
    """A composite spec's leaves: class name, shape and dtype, and the tensorclass (``data_cls``) of each composite."""
    leaves = {}
    for key in sorted(spec.keys(True, True), key=str):
        leaf = spec[key]
        leaves[str(key)] = [type(leaf).__name__, list(leaf.shape), str(leaf.dtype)]
    classes = {}
    for key in sorted(spec.keys(True), key=str):
        data_cls = getattr(spec[key], "data_cls", None)
        if data_cls is not None:
            classes[str(key)] = data_cls.__name__
    return {"shape": list(spec.shape), "leaves": leaves, "data_cls": classes}


def env_specs(api: Any, tokenizer: Any) -> dict[str, Any]:
    """A ``ChatEnv`` of batch size 2's specs in each input mode (observation, action, state, reward, done: their
    leaves' classes, shapes and dtypes, the composites' tensorclasses, the ``*_keys`` lists, the spec classes of
    ``reward_spec`` / ``done_spec``), and the reward spec with a ``GSM8KRewardParser`` appended."""
    out: dict[str, Any] = {}
    for mode in ("history", "text", "tokens"):
        env = api.ChatEnv(input_mode=mode, batch_size=(2,), tokenizer=tokenizer)
        record = {
            name: _spec_record(getattr(env, f"full_{name}_spec"))
            for name in ("observation", "action", "state", "reward", "done")
        }
        record["keys"] = {
            name: [str(k) for k in getattr(env, f"{name}_keys")] for name in ("observation", "action", "reward", "done")
        }
        record["shortcut_types"] = {
            name: type(getattr(env, f"{name}_spec")).__name__ for name in ("observation", "action", "reward", "done")
        }
        out[mode] = record
    env = api.ChatEnv(input_mode="history", batch_size=(2,), tokenizer=tokenizer)
    env = env.append_transform(api.GSM8KRewardParser(tokenizer=tokenizer))
    out["gsm8k_reward"] = {"reward": _spec_record(env.full_reward_spec), "keys": [str(k) for k in env.reward_keys]}
    return out


def library(
    ChatEnv: Any,
    History: Any,
    ChatHistory: Any,
    Text: Any,
    GSM8KRewardParser: Any,
    IfEvalScorer: Any = None,
    LLMCollector: Any = None,
    TransformersWrapper: Any = None,
    Transform: Any = None,
    tools: Any = None,
    limit_turns: Any = None,
) -> SimpleNamespace:
    """The classes a probe uses, from one library."""
    return SimpleNamespace(
        ChatEnv=ChatEnv,
        History=History,
        ChatHistory=ChatHistory,
        Text=Text,
        GSM8KRewardParser=GSM8KRewardParser,
        IfEvalScorer=IfEvalScorer,
        LLMCollector=LLMCollector,
        TransformersWrapper=TransformersWrapper,
        Transform=Transform,
        tools=tools,
        limit_turns=limit_turns,
    )
