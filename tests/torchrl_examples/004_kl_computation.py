# Seed: 004_f621bca59e0c4348.txt, KLComputation docstring "Examples:".
# Shows: KLComputation on random gen/ref log-probs (2 x 10) under "next", subtracting the KL from a (2, 10, 1) reward.
# Undefined in the seed: KLComputation (the docstring's own class; imported in the harness preamble).

# --- harness preamble (not part of the seed) ---
from torchrl.envs.llm.transforms.kl import KLComputation  # noqa: I001

# --- seed example ---
from tensordict import TensorDict
import torch

# Create sample log-probs
gen_log_probs = torch.randn(2, 10)  # 2 samples, 10 tokens each
ref_log_probs = torch.randn(2, 10)

# Create data with next tensordict
next_td = TensorDict(
    {
        ("gen_log_probs", "full"): gen_log_probs,
        ("ref_log_probs", "full"): ref_log_probs,
        "reward": torch.randn(2, 10, 1),
    },
    batch_size=(2,)
)
data = TensorDict(next=next_td, batch_size=(2,))

# Create KLComputation transform
kl_transform = KLComputation(
    gen_log_probs_key=("gen_log_probs", "full"),
    ref_log_probs_key=("ref_log_probs", "full"),
    kl_key="kl_penalty",
    add_to_reward=True,
    coef=1.0,
)

# Apply transform
result = kl_transform(data)
kl = result["next"].get("kl_penalty")
print(f"KL shape: {kl.shape}")
