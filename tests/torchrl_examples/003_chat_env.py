# Seed: 003_ce42da60f6f21460.txt, ChatEnv docstring "Examples:".
# Shows: ChatEnv in history mode: reset with a "query" (system prompt + user message), step with a full History.
# Undefined in the seed: none (no hub model is used).

# --- seed example ---
from torchrl.envs.llm import ChatEnv  # noqa: I001
from torchrl.data.llm import History
from tensordict import TensorDict

# Create a basic chat environment
env = ChatEnv(
    system_prompt="You are a helpful assistant.",
    input_mode="history"
)

# Reset with a user query
reset_data = TensorDict({"query": "Hello, how are you?"}, batch_size=(1,))
obs = env.reset(reset_data)
print(obs["history"].prompt)  # History with system prompt + user message

# Simulate LLM response and step
response_data = TensorDict({
    "history": History.from_chats([[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"}
    ]])
}, batch_size=(1,))
next_obs = env.step(response_data)
print(next_obs["history"].prompt)  # Full conversation history
