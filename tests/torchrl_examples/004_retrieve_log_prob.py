# Seed: 004_f621bca59e0c4348.txt, RetrieveLogProb docstring "Examples:".
# Shows: RetrieveLogProb on a ChatHistory(full=...) batch of 2 chats: assistant-only reference log-probs, padded.
# Undefined in the seed: RetrieveLogProb (the docstring's own class; imported in the harness preamble).

# --- harness preamble (not part of the seed) ---
from torchrl.envs.llm.transforms.kl import RetrieveLogProb  # noqa: I001

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

# Create reference model
ref_model = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    input_mode="history",
    generate=False,
    return_log_probs=True,
    pad_output=True,
)

# Create the RetrieveLogProb transform
transform = RetrieveLogProb(
    ref_model,
    assistant_only=True,
    tokenizer=tokenizer,
)

# Prepare data using ChatHistory
chat_history = ChatHistory(full=history)
data = TensorDict(history=chat_history, batch_size=(2,))

# Apply the transform to get reference log probabilities
result = transform(data)
log_probs_key = (ref_model.log_probs_key, "full")
ref_log_probs = result.get(log_probs_key)
print(f"Log-probs shape: {ref_log_probs.shape}")
