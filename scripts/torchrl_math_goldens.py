r"""Golden outputs of TorchRL 0.14.1's ``MATHEnv`` and ``MATHRewardParser``, for side-by-side checks.

Runs in the side virtual environment that has ``torchrl``, ``datasets`` and ``math-verify`` 0.9.0 (never in llmrl's
own one; llmrl's install has the same math-verify, through verifiers, so both sides compare answers symbolically)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_math_goldens.py \
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl/math.json

The cases are data (``ROWS``, ``RESPONSES``, ``BOXED``, ``MATCHES``), so ``tests/test_competition_math.py`` builds
the same dataset (a folder with ``train.jsonl``, as a local copy of a MATH dataset would be) and calls llmrl's
classes. Recorded: the prompts and ``answer`` fields of successive resets (no shuffling, one and two envs), each
response's step outputs on the first problem, and ``extract_boxed`` / ``answers_match`` on their own.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROWS = [
    {"problem": "What is $1+1$?", "solution": "Adding, $1+1=\\boxed{2}$.", "level": "Level 1", "type": "Prealgebra"},
    {
        "problem": "Simplify $\\frac{4}{6}$.",
        "solution": "Divide by 2: $\\boxed{\\frac{2}{3}}$.",
        "level": "Level 2",
        "type": "Algebra",
    },
    {"problem": "Solve $x^2=9$ for $x>0$.", "solution": "So $x=\\boxed{3}$.", "level": "Level 1", "type": "Algebra"},
    {
        "problem": "Write $(1,2)$ as a point.",
        "solution": "First $\\boxed{1}$ then the point $\\boxed{\\left( 1, 2 \\right)}$.",
        "level": "Level 3",
        "type": "Geometry",
    },
    {"problem": "How many sides has a square?", "solution": "A square has 4 sides.", "level": "Level 1", "type": "x"},
]
RESETS = {"one_env": {"kwargs": {}, "resets": 6}, "two_envs": {"kwargs": {"num_envs": 2}, "resets": 3}}
RESPONSES = [
    "<think>1 and 1</think><answer>2</answer>",
    "<answer> 2 </answer>",
    "<answer>$2$</answer>",
    "<answer>3</answer>",
    "<think>only thinking</think>",
    "<answer></answer>",
    "2",
    "<answer>2</answer><|im_end|>",
]
BOXED = [
    "so \\boxed{5}",
    "\\boxed{\\frac{1}{2}} and then \\boxed{7}",
    "\\boxed{a{b}c}",
    "no box here ",
    "\\boxed{unclosed {",
    "\\boxed{}",
]
MATCHES = [
    ["\\frac{2}{3}", "\\frac{2}{3}"],
    ["\\frac 2 3", "\\frac{2}{3}"],
    ["(1, 2)", "\\left( 1, 2 \\right)"],
    ["1,000", "1000"],
    ["$5$", "5"],
    ["x\\!=\\,3", "x=3"],
    ["0.5", "\\frac{1}{2}"],
    ["2", "3"],
]


def write_dataset(folder: Path) -> Path:
    """The rows as ``folder/train.jsonl`` (a folder ``datasets.load_dataset`` reads as a dataset with a train split)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torchrl
    import transformers
    from torchrl.data.llm import History
    from torchrl.envs.llm.datasets.math import MATHEnv
    from torchrl.envs.llm.reward.math import MATHRewardParser

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(args.model).expanduser()))
    folder = write_dataset(Path(tempfile.mkdtemp()) / "math")
    record = {"torchrl": torchrl.__version__, "resets": {}, "responses": [], "boxed": [], "matches": []}
    for name, case in RESETS.items():
        env = MATHEnv(dataset=str(folder), tokenizer=tokenizer, shuffle=False, **case["kwargs"])
        seen = []
        for _ in range(case["resets"]):
            td = env.reset()
            prompt = td["history", "prompt"]
            seen.append({"roles": prompt.role, "contents": prompt.content, "answers": list(td["answer"])})
        record["resets"][name] = seen

    env = MATHEnv(dataset=str(folder), tokenizer=tokenizer, shuffle=False)
    first = env.reset()
    for text in RESPONSES:
        td = first.clone()
        reply = History(role="assistant", content=text, batch_size=(1,)).unsqueeze(-1)
        td["history", "full"] = td["history", "prompt"].extend(reply, inplace=False, dim=-1)
        td["history", "response"] = reply
        out = env.step(td)["next"]
        keys = ("reward", "reward_answer", "reward_think", "reward_right", "success", "done", "terminated")
        record["responses"].append({"text": text, **{k: out[k].tolist() for k in keys}})
    record["boxed"] = [[text, MATHRewardParser.extract_boxed(text)] for text in BOXED]
    record["matches"] = [[a, b, MATHRewardParser.answers_match(a, b)] for a, b in MATCHES]
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {len(record['resets'])} reset cases, {len(record['responses'])} responses")


if __name__ == "__main__":
    main()
