# Seed: 004_f621bca59e0c4348.txt, KLRewardTransform docstring "Examples:", second half (recommended approach).
# Shows: RetrieveKL(gen_model, ref_model, assistant_only=True), the replacement for the legacy KLRewardTransform.
# Undefined in the seed: gen_model, ref_model (defined in the harness preamble).

# --- harness preamble (not part of the seed) ---
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
# Recommended approach using RetrieveKL
from torchrl.envs.llm.transforms.kl import RetrieveKL  # noqa: E402, I001
transform = RetrieveKL(gen_model, ref_model, assistant_only=True)
