# Seed: 000_0e7116b0b4865633.txt, "Collectors" section (policy-version tracking with LLMCollector + vLLMUpdater).
# Shows: LLMCollector(track_policy_version=True) adds a PolicyVersion transform that stamps "policy_version" on data.
# Undefined in the seed: make_env(), make_policy() ("place your code here"); defined in the harness preamble.

# --- harness preamble (not part of the seed) ---
from torch.utils.data import DataLoader
from torchrl.envs.llm import ChatEnv
from torchrl.modules.llm import TransformersWrapper
from transformers import AutoModelForCausalLM, AutoTokenizer


def make_env():
    # A ChatEnv fed by a DataLoadingPrimer (ChatEnv.from_dataloader), as the reference page describes.
    prompts = [{"query": "What is 2 + 2?"}, {"query": "Name a colour."}]
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
    return ChatEnv.from_dataloader(DataLoader(prompts, batch_size=1), tokenizer=tokenizer, batch_size=(1,))


def make_policy():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)  # noqa: F821
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval()  # noqa: F821
    return TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs={"max_new_tokens": 8}
    )


# --- seed example ---
from torchrl.envs.llm.transforms import PolicyVersion  # noqa: E402, F401, I001
from torchrl.collectors.llm import LLMCollector  # noqa: E402
from torchrl.collectors.llm.weight_update import vLLMUpdater  # noqa: E402
env = make_env()  # place your code here
policy = make_policy()  # place your code here
collector = LLMCollector(env, policy=policy, weight_updater=vLLMUpdater(), track_policy_version=True)
# init the updater
collector.weight_updater.init(...)
# the version is incremented after each weight update
collector.update_policy_weights_(state_dict=...)
print(collector.policy_version_tracker.version)
# the policy version is written in the data
for data in collector:
    print(data["policy_version"])
