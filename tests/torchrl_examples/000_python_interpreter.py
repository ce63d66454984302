# Seed: 000_0e7116b0b4865633.txt, "Transforms" section (PythonInterpreter tool appended to a ChatEnv).
# Shows: ChatEnv + PythonInterpreter: reset with a prompt, step with a simulated LLM response holding a code block.
# Undefined in the seed: none (only the hub model id "Qwen/Qwen2.5-7B-Instruct" is replaced by DEFAULT_MODEL).

# --- seed example ---
from torchrl.envs.llm.transforms import PythonInterpreter  # noqa: I001
from torchrl.envs.llm import ChatEnv
from tensordict import TensorDict, set_list_to_stack
from transformers import AutoTokenizer
from pprint import pprint
set_list_to_stack(True).set()
tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
base_env = ChatEnv(
    tokenizer=tokenizer,
    system_prompt="You are an assistant that can execute Python code. Decorate your code with ```python``` tags.",
    user_role="user",
    system_role="system",
    batch_size=[1],
)
env = base_env.append_transform(PythonInterpreter())
env.set_seed(0)
# Pass the reset data - the prompt - to the environment
reset_data = env.reset(TensorDict(
    text="Let's write a Python function that returns the square of a number.",
    batch_size=[1])
)
# Simulate an action - i.e., a response from the LLM (as if we were an LLM)
action = """Here is a block of code to be executed in python:
```python
def square(x):
    return x * x
print('testing the square function with input 2:', square(2))
```
<|im_end|>
"""
step_data = reset_data.set("text_response", [action])
s, s_ = env.step_and_maybe_reset(reset_data)
# The history is a stack of chat messages.
# The python interpreter transform has executed the code in the last message.
pprint(s_["history"].apply_chat_template(tokenizer=tokenizer))
