# Seed: 002_826a258ee385f037.txt, LLMCollector docstring "Examples:".
# Shows: LLMCollector over LLMEnv.from_dataloader with a vLLMWrapper policy (vllm.LLM("gpt2")), three dialog turns.
# Undefined in the seed: LLMCollector (the docstring's own class; imported in the harness preamble).

# --- harness preamble (not part of the seed) ---
from torchrl.collectors.llm import LLMCollector  # noqa: I001

# --- seed example ---
import vllm
from torchrl.modules import vLLMWrapper
from pytorch.rl.test.mocking_classes import DummyStrDataLoader
from torchrl.envs import LLMEnv
llm_model = vllm.LLM(DEFAULT_MODEL)  # noqa: F821
tokenizer = llm_model.get_tokenizer()
tokenizer.pad_token = tokenizer.eos_token
policy = vLLMWrapper(llm_model)
dataloader = DummyStrDataLoader(1)
env = LLMEnv.from_dataloader(
    dataloader=dataloader,
    tokenizer=tokenizer,
    from_text=True,
    batch_size=1,
    group_repeats=True,
)
collector = LLMCollector(
    env=env,
    policy_factory=lambda: policy,
    dialog_turns_per_batch=env.batch_size[0],
    total_dialog_turns=3,
)
for i, data in enumerate(collector):
    if i == 2:
        print(data)
        break
del collector
