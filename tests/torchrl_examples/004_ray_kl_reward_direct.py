# Seed: 004_f621bca59e0c4348.txt, RayKLRewardTransform docstring "Examples:", Option 2 (model passed directly).
# Shows: RayKLRewardTransform(ref_model=ref_model, device=cuda), Ray serializing the wrapped reference model.
# Undefined in the seed: torch, RayKLRewardTransform, ref_model (an LLM wrapper: TransformersWrapper, generate=False).

# --- harness preamble (not part of the seed) ---
import torch
from torchrl.envs.llm.transforms.kl import RayKLRewardTransform
from torchrl.modules.llm import TransformersWrapper
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
ref_model = TransformersWrapper(
    AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval(),  # noqa: F821
    tokenizer=tokenizer,
    input_mode="tokens",
    generate=False,
    return_log_probs=True,
)

# --- seed example ---
# Option 2: Pass model directly (Ray handles serialization)
transform = RayKLRewardTransform(ref_model=ref_model, device=torch.device("cuda"))
