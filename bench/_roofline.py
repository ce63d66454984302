"""How far a stage is from the machine: a measured matrix-multiply peak at the model's shapes, and the share of it
a stage reaches.

The rule (stated once, used by every bench table): a token costs ``2 * N`` FLOPs through the model when it is
generated or scored (one multiply-add per weight) and ``6 * N`` when it is trained on (forward, then the backward's
two products), where ``N`` is the number of weights in the model's matrix multiplies (every ``nn.Linear``, the
language-model head included, the embedding lookup not; attention's own products are left out, small at these
lengths). A stage's FLOP/s is that count over its measured seconds; its share of the peak is that over the best
FLOP/s ``torch.matmul`` reaches on these cores, in the stage's dtype, at the model's own weight shapes.
"""

from __future__ import annotations

import time
from functools import cache
from pathlib import Path

import torch


@cache
def matmul_weights(model_dir: str) -> int:
    """``N``: the weights in the model's matrix multiplies (built on the meta device; nothing is loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def weight_shapes(model_dir: str) -> list[tuple[int, int]]:
    """The distinct ``(in, out)`` shapes of the model's linear layers."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", c.num_attention_heads)
    head_dim = c.hidden_size // heads
    return sorted(
        {
            (c.hidden_size, c.hidden_size),
            (c.hidden_size, kv * head_dim),
            (c.hidden_size, c.intermediate_size),
            (c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.vocab_size),
        }
    )


@cache
def matmul_peak(model_dir: str, dtype: str, rows: int = 2048, repeats: int = 5) -> float:
    """The best FLOP/s of ``(rows x in) @ (in x out)`` over the model's weight shapes, in ``dtype``."""
    torch_dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32}[dtype]
    shapes = weight_shapes(model_dir)
    best = 0.0
    operands = [(torch.randn(rows, k, dtype=torch_dtype), torch.randn(k, n, dtype=torch_dtype)) for k, n in shapes]
    for _ in range(2):  # two passes, the best counts (one of four runs measured half the others: 210 vs ~425)
        for a, b in operands:
            torch.matmul(a, b)  # warm-up
            for _ in range(repeats):
                start = time.perf_counter()
                torch.matmul(a, b)
                best = max(best, 2.0 * rows * a.shape[1] * b.shape[1] / (time.perf_counter() - start))
    return best


def share_of_peak(model_dir: str | Path, tokens_per_s: float, dtype: str, training: bool = False) -> str:
    """``"x GFLOP/s = y % of the z GFLOP/s <dtype> matmul peak"`` for a stage running at ``tokens_per_s``."""
    per_token = (6 if training else 2) * matmul_weights(str(model_dir))
    flops = tokens_per_s * per_token
    peak = matmul_peak(str(model_dir), dtype)
    rule = "6N" if training else "2N"
    share = 100 * flops / peak
    return f"{flops / 1e9:.1f} GFLOP/s ({rule}) = {share:.1f} % of the {peak / 1e9:.0f} GFLOP/s {dtype} peak"
