"""Golden renderings of TorchRL 0.14.1's named chat templates (``History.apply_chat_template(chat_template_name=...)``:
"llama", "deepseek", "falcon", "dialogpt", "qwen", "chatml_format"), for side-by-side checks.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_template_goldens.py \\
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl/chat_templates.json

For each name and each chat of ``CHATS`` (the last one has two tool turns in a row): the text with and without the
generation prompt, and the assistant mask of the tokenized chat (the packaged SmolLM2 tokenizer: its bos/eos are what
the templates insert).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAMES = ("llama", "deepseek", "falcon", "dialogpt", "qwen", "chatml_format")
CHATS = [
    [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "It is 4."}],
    [{"role": "user", "content": "Only user"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like the sky."}],
    [{"role": "user", "content": "3*4 and 5+5?"}, {"role": "assistant", "content": "Calling the calculator."},
     {"role": "tool", "content": "12"}, {"role": "tool", "content": "10"},
     {"role": "assistant", "content": "12 and 10."}],
]  # fmt: skip


def main() -> None:
    from tensordict import lazy_stack
    from torchrl.data.llm.history import History
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    golden: dict[str, list] = {}
    for name in NAMES:
        rows = []
        for chat in CHATS:
            history = lazy_stack([History.from_chats([chat])[0]])
            row = {}
            for prompt in (False, True):
                row[f"text_{prompt}"] = history.apply_chat_template(
                    tokenizer=tokenizer, chat_template_name=name, add_generation_prompt=prompt, tokenize=False
                )[0]
            tokens = history.apply_chat_template(
                tokenizer=tokenizer, chat_template_name=name, add_generation_prompt=False, tokenize=True,
                return_assistant_tokens_mask=True, return_dict=True,
            )  # fmt: skip
            row["input_ids"] = tokens["input_ids"][0].tolist()
            row["assistant_masks"] = tokens["assistant_masks"][0].tolist()
            rows.append(row)
        golden[name] = rows
    Path(args.out).write_text(json.dumps({"chats": CHATS, "names": golden}, indent=1) + "\n")
    print(f"wrote {args.out}: {len(NAMES)} templates x {len(CHATS)} chats")


if __name__ == "__main__":
    main()
