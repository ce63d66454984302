"""Golden values of TorchRL 0.14.1's ``GRPOLoss`` and ``SFTLoss`` called on a TensorDict, for side-by-side checks.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_loss_goldens.py \\
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl/losses_td.json

Two chats are scored by TorchRL's ``TransformersWrapper`` (history mode, ``generate=False``); the sampler's
log-probs are the scores plus seeded Gaussian noise (so the importance ratios move and some clip), and the
advantage is one value per chat, spread over its tokens as TorchRL's ``MCAdvantage`` writes it. The file records
those inputs (tokens, assistant masks, scores, sampler log-probs, advantages) and what TorchRL's losses return:
``GRPOLoss`` under the ``rlhf`` and ``generic`` masking strategies, ``SFTLoss`` on the chats.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHATS = [
    [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "2+3 = 5."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue is a colour I like."}],
]
ADVANTAGES = [1.0, -0.5]
NOISE = 0.3
GRPO_TERMS = ("loss_objective", "clip_fraction", "kl_approx", "ESS", "entropy", "loss_entropy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the packaged model folder")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    import tensordict
    import torch
    import torchrl
    from tensordict import TensorDict, lazy_stack
    from torchrl.data.llm import History
    from torchrl.modules.llm import TransformersWrapper
    from torchrl.modules.llm.policies import ChatHistory
    from torchrl.objectives.llm import GRPOLoss, SFTLoss
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    actor = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=False, return_log_probs=True, pad_output=False
    )
    history = History.from_chats(CHATS)
    scored = actor(TensorDict(history=ChatHistory(full=history, batch_size=(2,)), batch_size=(2,)))
    scores = scored.get(("log_probs", "full"), as_list=True)
    noise = torch.Generator().manual_seed(0)
    sampler = [(s + NOISE * torch.randn(s.shape, generator=noise)).detach() for s in scores]
    rows = []
    for i, advantage in enumerate(ADVANTAGES):
        row = scored[i].clone()
        row.set(("log_probs", "full"), sampler[i])
        row.set("advantage", torch.full((sampler[i].numel(), 1), advantage))
        rows.append(row)
    batch = lazy_stack(rows)
    record: dict = {
        "versions": {"torchrl": torchrl.__version__, "tensordict": tensordict.__version__, "torch": torch.__version__},
        "chats": CHATS,
        "inputs": {
            "tokens": [t.tolist() for t in scored.get(("tokens", "full"), as_list=True)],
            "assistant_mask": [m.tolist() for m in scored.get(("masks", "all_assistant_mask"), as_list=True)],
            "log_probs": [s.tolist() for s in scores],
            "sampler_log_probs": [s.tolist() for s in sampler],
            "advantage": ADVANTAGES,
        },
    }
    for strategy in ("rlhf", "generic"):
        out = GRPOLoss(actor, masking_strategy=strategy)(batch.copy())
        record[f"grpo_{strategy}"] = {k: float(out.get(k).detach()) for k in GRPO_TERMS}
    sft = SFTLoss(actor, tokenizer=tokenizer)(
        TensorDict(history=ChatHistory(full=history, batch_size=(2,)), batch_size=(2,))
    )
    record["sft"] = {"loss_sft": float(sft.loss_sft.detach())}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("inputs", "chats")}, indent=1))


if __name__ == "__main__":
    main()
