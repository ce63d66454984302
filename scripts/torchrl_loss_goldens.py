"""Golden values of TorchRL 0.14.1's ``GRPOLoss`` and ``SFTLoss`` called on a TensorDict, for side-by-side checks.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_loss_goldens.py \\
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl/losses_td.json

Two chats are scored by TorchRL's ``TransformersWrapper`` (history mode, ``generate=False``); the sampler's
log-probs are the scores plus seeded Gaussian noise (so the importance ratios move and some clip), and the
advantage is one value per chat, spread over its tokens as TorchRL's ``MCAdvantage`` writes it. The file records
those inputs (tokens, assistant masks, scores, sampler log-probs, advantages) and what TorchRL's losses return:
``GRPOLoss`` under the ``rlhf`` and ``generic`` masking strategies, ``SFTLoss`` on the chats; ``DAPO`` and
``CISPOLoss`` (clip ``(0.2, 0.28)``) on the same batch with one advantage for every token of both chats (TorchRL
still pads that advantage on the right and the log-probs on the left: the test reproduces its values by hand so),
and ``DistillationLoss``
against teacher log-probs that are the scores plus another seeded noise, in both KL directions and reductions.
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
CLIP_HIGHER = (0.2, 0.28)
SAME_ADVANTAGE = (1.0, -1.0)  # one advantage for every token of the batch: each value gives one record
DISTILL_CASES = {
    "reverse_mean": {"kl_direction": "reverse"},
    "forward_mean": {"kl_direction": "forward"},
    "reverse_sum_unnormalized": {"kl_direction": "reverse", "reduction": "sum", "normalize_by_seq_length": False},
    "reverse_all_tokens": {"kl_direction": "reverse", "assistant_only": False},
}


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
    from torchrl.objectives.llm import DAPO, CISPOLoss, DistillationLoss, GRPOLoss, SFTLoss
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
    for advantage in SAME_ADVANTAGE:
        same = batch.copy()
        for i, row in enumerate(same.unbind(0)):
            row.set("advantage", torch.full((sampler[i].numel(), 1), advantage))
        for name, cls in (("dapo", DAPO), ("cispo", CISPOLoss)):
            out = cls(actor, masking_strategy="rlhf", clip_epsilon=CLIP_HIGHER)(same.copy())
            record[f"{name}_{advantage:+g}"] = {k: float(out.get(k).detach()) for k in GRPO_TERMS}
            record[f"{name}_{advantage:+g}"]["output_type"] = type(out).__name__
    teacher_noise = torch.Generator().manual_seed(1)
    teacher = [(s - 0.2 + NOISE * torch.randn(s.shape, generator=teacher_noise)).detach() for s in scores]
    record["inputs"]["teacher_log_probs"] = [t.tolist() for t in teacher]
    distill = batch.copy()
    for i, row in enumerate(distill.unbind(0)):
        row.set(("next", "teacher_log_probs", "full"), teacher[i])
    for name, kwargs in DISTILL_CASES.items():
        out = DistillationLoss(actor, tokenizer=tokenizer, **kwargs)(distill.copy())
        record[f"distill_{name}"] = {
            "loss_distill": out.loss_distill.detach().tolist(),
            "kl_to_teacher": float(out.kl_to_teacher),
        }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("inputs", "chats")}, indent=1))


if __name__ == "__main__":
    main()
