# Seed: 004_f621bca59e0c4348.txt, RayRetrieveKL docstring "Examples:", Option 1 (model factories).
# Shows: RayRetrieveKL(gen_model=None, ref_model=None, *_factory=..., num_gpus=1, device=cuda): RetrieveKL in Ray.
# Undefined in the seed: torch, TransformersWrapper, RayRetrieveKL, model, ref_model (HF models), tokenizer.

# --- harness preamble (not part of the seed) ---
import torch
from torchrl.envs.llm.transforms.kl import RayRetrieveKL
from torchrl.modules.llm import TransformersWrapper
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # noqa: F821
ref_model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # noqa: F821

# --- seed example ---
# Option 1: Using model factories for explicit resource control
def create_gen_model():
    return TransformersWrapper(model, tokenizer=tokenizer, generate=False, return_log_probs=True)
def create_ref_model():
    return TransformersWrapper(ref_model, tokenizer=tokenizer, generate=False, return_log_probs=True)
transform = RayRetrieveKL(
    gen_model=None, ref_model=None,
    gen_model_factory=create_gen_model,
    ref_model_factory=create_ref_model,
    num_gpus=1,
    device=torch.device("cuda")
)
