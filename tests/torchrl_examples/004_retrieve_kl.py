# Seed: 004_f621bca59e0c4348.txt, RetrieveKL docstring "Examples:".
# Shows: RetrieveKL (two RetrieveLogProb + KLComputation) on a batch of 2 chats; KL written to next/kl_penalty.
# Undefined in the seed: RetrieveKL (the docstring's own class; imported in the harness preamble).

# --- harness preamble (not part of the seed) ---
from torchrl.envs.llm.transforms.kl import RetrieveKL  # noqa: I001

# --- seed example ---
from torchrl.data.llm import History
from torchrl.modules.llm import TransformersWrapper
from torchrl.modules.llm.policies import ChatHistory
from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM
from tensordict import TensorDict, set_list_to_stack
import torch  # noqa: F401

# Set up list to stack for History
set_list_to_stack(True).set()

# Create chat data
chats = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather like?"},
        {"role": "assistant", "content": "I can't check the weather for you."},
    ],
]
history = History.from_chats(chats)
print(f"Created history with shape: {history.shape}")

# Setup tokenizer and model
tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
tokenizer.pad_token = tokenizer.eos_token
model = OPTForCausalLM(OPTConfig()).eval()

# Create generation and reference models
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

# Create RetrieveKL transform
transform = RetrieveKL(
    gen_model=gen_model,
    ref_model=ref_model,
    assistant_only=True,
    tokenizer=tokenizer,
)

# Prepare data with next tensordict using ChatHistory
chat_history = ChatHistory(full=history)
next_td = TensorDict(history=chat_history, batch_size=(2,))
data = TensorDict(history=chat_history, next=next_td, batch_size=(2,))

# Apply transform
result = transform(data)
kl = result["next"].get("kl_penalty")
print(f"KL shape: {kl.shape}")
