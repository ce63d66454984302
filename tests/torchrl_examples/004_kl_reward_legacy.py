# Seed: 004_f621bca59e0c4348.txt, KLRewardTransform docstring "Examples:", first half (legacy usage).
# Shows: the legacy KLRewardTransform(gen_model, ref_model) call (the recommended RetrieveKL half is a separate file).
# Undefined in the seed: KLRewardTransform, gen_model, ref_model (defined in the harness preamble).

# --- harness preamble (not part of the seed) ---
from torchrl.envs.llm.transforms.kl import KLRewardTransform
from torchrl.modules.llm import TransformersWrapper
from transformers import AutoModelForCausalLM, AutoTokenizer

# gen_model / ref_model as in the RetrieveKL docstring of the same seed (history input, no generation).
tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # noqa: F821
gen_model = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    input_mode="history",
    generate=False,
    return_log_probs=True,
    pad_output=True,
    log_probs_key="gen_log_probs",
)
ref_model = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    input_mode="history",
    generate=False,
    return_log_probs=True,
    pad_output=True,
    log_probs_key="ref_log_probs",
)

# --- seed example ---
# Legacy usage (not recommended for new code)
transform = KLRewardTransform(gen_model, ref_model)
