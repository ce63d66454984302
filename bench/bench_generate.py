"""Side-by-side generation throughput: llmrl's ``generate`` vs raw ``vllm.LLM.generate`` vs transformers.

Usage: ``.venv/bin/python bench/bench_generate.py [--prompts 16] [--max-tokens 128] [--dtype bfloat16]``
Prints tokens/s for each and the ratios, all measured in this one run on the same prompts.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf", action="store_true", help="Skip the transformers baseline.")
    args = parser.parse_args()

    from _roofline import matmul_peak, share_of_peak
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from llmrl_core.builtin_data import load_gsm8k
    from llmrl_core.model_store import resolve_model
    from llmrl_core.modules.backends.transformers.scoring import load_causal_lm, render_chat_prompt
    from llmrl_core.modules.backends.types import EngineConfig
    from llmrl_core.modules.backends.vllm.engine import generate, make_llm

    model_dir = resolve_model(EngineConfig().model)
    matmul_peak(str(model_dir), args.dtype)  # measured before the engine starts: the cores are the peak's alone
    llm = make_llm(EngineConfig(dtype=args.dtype))
    tok = llm.get_tokenizer()
    prompts = [
        render_chat_prompt(tok, [{"role": "user", "content": r["question"]}]) for r in load_gsm8k("test", args.prompts)
    ]
    # Fixed length (ignore_eos) so every backend generates the same number of tokens.
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0, logprobs=0, ignore_eos=True)
    # Warm-up on the full prompt set, so every timed run sees the same (warm) prefix cache.
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    def run_raw() -> int:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def run_ours() -> int:
        groups = generate(llm, prompts, max_tokens=args.max_tokens, temperature=1.0, seed=0, ignore_eos=True)
        return sum(len(g[0].token_ids) for g in groups)

    timings: dict[str, list[float]] = {"raw": [], "ours": []}
    counts: dict[str, int] = {}
    for _ in range(args.repeats):  # interleaved, best of N: fair under background load
        for name, fn in (("raw", run_raw), ("ours", run_ours)):
            t = time.perf_counter()
            counts[name] = fn()
            timings[name].append(time.perf_counter() - t)
    raw_tokens, ours_tokens = counts["raw"], counts["ours"]
    raw_s, ours_s = min(timings["raw"]), min(timings["ours"])

    print(f"vllm raw       {raw_tokens / raw_s:8.1f} tok/s ({raw_tokens} tokens, {raw_s:.1f} s)")
    print(f"llmrl generate {ours_tokens / ours_s:8.1f} tok/s ({ours_tokens} tokens, {ours_s:.1f} s)")
    print(f"ratio llmrl/raw = {(ours_tokens / ours_s) / (raw_tokens / raw_s):.3f}")
    print(f"of the machine (decode): llmrl {share_of_peak(model_dir, ours_tokens / ours_s, args.dtype)}")
    if args.skip_hf:
        return
    model, hf_tok = load_causal_lm(dtype=args.dtype)
    hf_tok.padding_side = "left"
    batch = hf_tok.pad({"input_ids": prompts}, return_tensors="pt")
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=args.max_tokens,
            min_new_tokens=args.max_tokens,
            do_sample=True,
            temperature=1.0,
            pad_token_id=hf_tok.pad_token_id,
        )
    hf_s = time.perf_counter() - t
    hf_tokens = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    print(f"transformers   {hf_tokens / hf_s:8.1f} tok/s ({hf_tokens} tokens, {hf_s:.1f} s)")
    print(f"ratio llmrl/transformers = {(ours_tokens / ours_s) / (hf_tokens / hf_s):.2f}")


if __name__ == "__main__":
    main()
