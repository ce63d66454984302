"""Golden outputs of TorchRL 0.14.1's ``CountdownEnv`` and ``CountdownRewardParser``, for side-by-side checks.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_countdown_goldens.py \\
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl/countdown.json

The cases are data (``RESETS``, ``RESPONSES``, ``EXPRESSIONS``), so ``tests/test_countdown.py`` builds the same
envs and calls llmrl's classes. Recorded: the prompts (roles and contents) and ``answer`` fields of successive
resets for several seeds and sizes; for the first problem of a seed, each response's step outputs (``reward``,
``reward_answer``, ``reward_think``, ``reward_right``, ``success``, ``done``, ``terminated``); and
``validate_expression`` on expressions without ``**`` or ``//`` (where llmrl departs on purpose: module docstring of
``llmrl_core/envs/countdown.py``). In a response, ``{sum}`` is the problem's numbers joined with `` + ``, ``{first}``
its first number, ``{target}`` its target.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESETS = {
    "seed3_one_env": {"kwargs": {"seed": 3}, "resets": 3},
    "seed11_two_envs": {"kwargs": {"seed": 11, "num_envs": 2}, "resets": 2},
    "seed5_three_small_numbers": {
        "kwargs": {"seed": 5, "num_count": 3, "max_number": 9, "max_target": 50},
        "resets": 4,
    },
    "seed7_six_numbers": {"kwargs": {"seed": 7, "num_count": 6, "max_number": 25, "max_target": 100}, "resets": 2},
}
RESPONSES = [
    "<think>add them</think><answer>{sum}</answer>",
    "<answer>{sum}</answer>",
    "<think>add them</think> <answer> ({sum}) </answer>",
    "<answer>{first} + {first} + {first}</answer>",
    "<answer>{target}</answer>",
    "<answer>7 * 1000</answer>",
    "<answer>x + 1</answer>",
    "<think>no answer</think>",
    "<answer></answer>",
    "plain text {sum}",
    "<answer>{sum}</answer><|im_end|>",
]
EXPRESSIONS = [
    ["(25 + 3) * 4", 112, [25, 3, 4, 9]],
    ["(25 + 3) * 4", 112, [25, 3, 9, 9]],
    ["25 * 4 + 3 * 4", 112, [25, 4, 3, 4]],
    ["25 * 4 + 3 * 4", 112, [25, 4, 3]],
    ["100 / 4", 25, [100, 4]],
    ["100 / 3", 33, [100, 3]],
    ["8 / (4 - 4)", 1, [8, 4, 4]],
    ["-3 + 10", 7, [3, 10]],
    ["2.5 * 2", 5, [2, 5]],
    ["10 - 2 - 3", 5, [10, 2, 3]],
    ["10 - (2 - 3)", 11, [10, 2, 3]],
    ["(10", 10, [10]],
    ["", 0, [1]],
    ["3 4", 34, [3, 4]],
    ["abs(3)", 3, [3]],
    ["1e3", 1000, [1, 3]],
]


def fill(response: str, answer: str) -> str:
    target = int(re.search(r"target=(\d+)", answer).group(1))
    numbers = [int(n) for n in re.search(r"numbers=([\d,]+)", answer).group(1).split(",")]
    return response.format(sum=" + ".join(map(str, numbers)), first=numbers[0], target=target)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torchrl
    import transformers
    from torchrl.data.llm import History
    from torchrl.envs.llm.datasets.countdown import CountdownEnv
    from torchrl.envs.llm.reward.countdown import CountdownRewardParser

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(args.model).expanduser()))
    record = {"torchrl": torchrl.__version__, "resets": {}, "responses": [], "expressions": []}
    for name, case in RESETS.items():
        env = CountdownEnv(tokenizer=tokenizer, **case["kwargs"])
        seen = []
        for _ in range(case["resets"]):
            td = env.reset()
            prompt = td["history", "prompt"]
            seen.append({"roles": prompt.role, "contents": prompt.content, "answers": list(td["answer"])})
        record["resets"][name] = seen

    env = CountdownEnv(tokenizer=tokenizer, seed=3)
    first = env.reset()
    answer = first["answer"][0]
    for template in RESPONSES:
        td = first.clone()
        text = fill(template, answer)
        reply = History(role="assistant", content=text, batch_size=(1,)).unsqueeze(-1)
        td["history", "full"] = td["history", "prompt"].extend(reply, inplace=False, dim=-1)
        td["history", "response"] = reply
        out = env.step(td)["next"]
        keys = ("reward", "reward_answer", "reward_think", "reward_right", "success", "done", "terminated")
        record["responses"].append({"template": template, "text": text, **{k: out[k].tolist() for k in keys}})
    record["problem"] = {"answer": answer}

    for expression, target, numbers in EXPRESSIONS:
        ok = CountdownRewardParser.validate_expression(expression, target, numbers)
        record["expressions"].append({"expression": expression, "target": target, "numbers": numbers, "valid": ok})
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {len(record['resets'])} reset cases, {len(record['responses'])} responses")


if __name__ == "__main__":
    main()
