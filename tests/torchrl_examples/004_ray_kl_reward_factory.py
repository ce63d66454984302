# Seed: 004_f621bca59e0c4348.txt, RayKLRewardTransform docstring "Examples:", Option 1 (model factory).
# Shows: RayKLRewardTransform(ref_model=None, ref_model_factory=..., num_gpus=1, device=cuda) hosting the KL in Ray.
# Undefined in the seed: torch, TransformersWrapper, RayKLRewardTransform, ref_model (a HF model), tokenizer.

# --- harness preamble (not part of the seed) ---
import torch
from torchrl.envs.llm.transforms.kl import RayKLRewardTransform
from torchrl.modules.llm import TransformersWrapper
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
ref_model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # noqa: F821

# --- seed example ---
# Option 1: Using model factory for explicit resource control
def create_ref_model():
    return TransformersWrapper(ref_model, tokenizer=tokenizer, generate=False, return_log_probs=True)
transform = RayKLRewardTransform(
    ref_model=None,
    ref_model_factory=create_ref_model,
    num_gpus=1,
    device=torch.device("cuda")
)
