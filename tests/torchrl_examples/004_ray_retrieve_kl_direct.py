# Seed: 004_f621bca59e0c4348.txt, RayRetrieveKL docstring "Examples:", Option 2 (models passed directly).
# Shows: RayRetrieveKL(gen_model=gen_model, ref_model=ref_model, device=cuda), Ray serializing both wrapped models.
# Undefined in the seed: torch, RayRetrieveKL, gen_model, ref_model (LLM wrappers, as in the RetrieveKL docstring).

# --- harness preamble (not part of the seed) ---
import torch
from torchrl.envs.llm.transforms.kl import RayRetrieveKL
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
# Option 2: Pass models directly (Ray handles serialization)
transform = RayRetrieveKL(gen_model=gen_model, ref_model=ref_model, device=torch.device("cuda"))
