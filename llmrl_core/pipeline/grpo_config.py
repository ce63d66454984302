"""``GRPOConfig``: every setting of a GRPO run, grouped by stage (YAML sections of the same names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from llmrl_core.pipeline.config_io import strict_config
from llmrl_core.pipeline.config_types import AtLeast1, Fraction, NonNegative, NonNegativeInt, Positive, Probability
from llmrl_core.pipeline.env_config import EnvConfig, validate_env_config
from llmrl_core.pipeline.init_config import InitConfig
from llmrl_core.pipeline.task_config import TaskConfig


def _check(ok: bool, setting: str, rule: str, value: Any) -> None:
    """Raise a ValueError naming ``setting`` when ``ok`` is false (config errors surface before any work)."""
    if not ok:
        raise ValueError(f"{setting} {rule}, got {value!r}")


@dataclass
class DataConfig:
    """Prompt source and batch shape: ``prompts_per_iteration`` prompts, each sampled ``group_size`` times."""

    source: str = "gsm8k:train"  # gsm8k:train | arithmetic:train[?ops=+&low=10&high=99] | a .jsonl/.parquet path
    prompts_per_iteration: AtLeast1 = 8  # prompts drawn per iteration (one policy version)
    group_size: AtLeast1 = 4  # responses sampled per prompt; GRPO compares the responses of a group
    shuffle: bool = True  # shuffle the source once, seeded by seed (false: file order)


ENGINE_DTYPES = ("auto", "bfloat16", "float16", "float32")
EngineDtype = Literal["auto", "bfloat16", "float16", "float32"]


@dataclass
class RolloutConfig:
    """Rollout workers and sampling: one resident vLLM engine per worker.

    The engine records the log-probs of the distribution it sampled from (vLLM's ``processed_logprobs``:
    temperature and top-p applied) and every stored row says so (``sampling_params.logprobs_mode``); the trainer
    divides its logits by the same temperature, so the GRPO ratio compares one policy on both sides. With
    ``top_p < 1`` the engine's log-probs are renormalised over the nucleus while the trainer scores the full
    temperature-scaled distribution: keep ``top_p = 1`` for exact agreement (the agreement metrics show the gap).
    """

    workers: AtLeast1 = 1  # rollout workers, one resident engine each
    dtype: EngineDtype = "auto"  # auto: bf16 on CUDA and on CPUs with AMX/AVX512-BF16, float32 elsewhere
    kv_cache_gb: Positive = 1.0  # each CPU engine's KV cache (GiB)
    max_new_tokens: AtLeast1 = 128  # longest response in tokens
    temperature: Positive = 0.7  # sampling temperature (the trainer scores at the same one)
    top_p: Probability = 1.0  # nucleus sampling (keep 1.0 for exact sampler/trainer agreement)
    max_model_len: int = 2048  # prompt + response tokens an engine accepts
    # processed: the log-probs of the distribution sampled from; raw: the model's at T = 1
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    # 0: synchronous (sample with version v, train v -> v+1). k >= 1: asynchronous with bounded staleness: the
    # batch that trains v -> v+1 is sampled by version max(0, v - k), so the engines sample ahead while the
    # trainer trains; the GRPO ratio uses the stored sampler log-probs.
    max_staleness: NonNegativeInt = 0
    # Placement and scale (runtime/cluster.py): each engine runs on tensor_parallel_size GPUs of its own (CUDA
    # only: CPU engines scale with rollout.workers); gpu_memory_utilization is vLLM's fraction of each GPU's
    # memory per engine (None: the engine default, 0.4; set it when engines share a GPU); threads are the CPU
    # threads (OMP_NUM_THREADS) of each CPU engine's worker (0: the available cores / rollout.workers).
    tensor_parallel_size: AtLeast1 = 1
    gpu_memory_utilization: Probability | None = None
    threads: NonNegativeInt = 0
    # How each published version reaches the engines: "checkpoint" (the engines load the version's checkpoint file
    # or object), "nccl" (one CUDA broadcast from the trainer to every engine; the checkpoint is still written, for
    # resume), "gloo" (the same broadcast between a CPU trainer and CPU engines), "cuda_ipc" (engines on the
    # trainer's GPU open its weights in place through CUDA IPC handles; opt-in, vLLM or transformers engines),
    # "auto" (nccl when the trainer and every vLLM engine run on CUDA on distinct GPUs, else checkpoint).
    weight_sync: Literal["auto", "checkpoint", "nccl", "gloo", "cuda_ipc"] = "auto"
    # env.agent (docs/agents.md): agent episodes run at once per engine, and the seconds one may take before it
    # fails (its own episode only)
    agent_concurrency: AtLeast1 = 8
    agent_timeout_s: Positive = 120.0
    # the share of a batch's agent episodes that may fail (crash, timeout, bad result) before the run stops with the
    # counts and an example; up to it, the failures are named in a warning and the rest trains (1: stop only when
    # every episode failed)
    max_failed_fraction: Fraction = 0.5
    # The engine: "vllm" (the default and the fast path) or "transformers" (model.generate behind the same actor
    # interface, for machines where vLLM is not installed; weights reach it by checkpoint or CUDA IPC, no tensor
    # parallelism)
    backend: Literal["vllm", "transformers"] = "vllm"
    # One GPU for the engine and the trainer (CUDA vLLM engines, synchronous runs): the engine sleeps while the
    # trainer trains (vLLM's sleep mode) and wakes for the next version's weights, so the trainer's activations
    # get the engine's memory. 1: weights to host memory, KV cache dropped; 2: both dropped (the next version's
    # load refills them, the cheaper choice here: every version is loaded anyway); 0: off.
    sleep_level: Literal[0, 1, 2] = 0
    # "module:Class": a subclass of TorchRL's vLLMWrapper (TransformersWrapper with backend transformers) that the
    # rollouts sample with, built as the engine's own policy is plus policy_kwargs (null: the wrapper itself)
    policy_class: str | None = None
    policy_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sleep_level:
            _check(
                self.backend == "vllm",
                "rollout.sleep_level",
                "needs rollout.backend=vllm (vLLM's sleep mode); set it to 0",
                self.sleep_level,
            )
            _check(
                self.max_staleness == 0,
                "rollout.sleep_level",
                f"needs a synchronous run (rollout.max_staleness=0, not {self.max_staleness}): with rollouts "
                "overlapping training the engine is never idle while the trainer trains",
                self.sleep_level,
            )
        if self.backend == "transformers":
            _check(
                self.weight_sync in ("auto", "checkpoint", "cuda_ipc"),
                "rollout.weight_sync",
                "must be auto, checkpoint or cuda_ipc with rollout.backend=transformers (it joins no broadcast "
                "group; NCCL and gloo need the vLLM engine)",
                self.weight_sync,
            )
            _check(
                self.tensor_parallel_size == 1,
                "rollout.tensor_parallel_size",
                "must be 1 with rollout.backend=transformers (one model per engine; tensor parallelism needs vllm)",
                self.tensor_parallel_size,
            )
        _check(
            self.max_model_len > self.max_new_tokens,
            "rollout.max_model_len",
            f"must exceed rollout.max_new_tokens ({self.max_new_tokens})",
            self.max_model_len,
        )


@dataclass
class TISConfig:
    """Off-policy correction against the sampler's log-probs (truncated / masked importance sampling).

    With ``cap`` set, the PPO ratio is taken against the trainer's own behaviour log-probs and each token (or,
    at ``level: sequence``, each row) is weighted by ``min(pi_trainer / pi_sampler, cap)`` (``mode: truncate``,
    TIS) or dropped when that ratio exceeds ``cap`` (``mode: mask``, masked IS). ``cap: null`` turns it off.
    """

    cap: Positive | None = None  # importance-weight cap (null: off)
    mode: Literal["truncate", "mask"] = "truncate"  # truncate: weight min(ratio, cap); mask: drop above cap
    level: Literal["token", "sequence"] = "token"  # one ratio per token, or per row (sequence)


@dataclass
class LoraConfig:
    """LoRA adapters on the trainer (peft); published weights are the merged model."""

    enabled: bool = False  # train LoRA adapters instead of every weight
    r: AtLeast1 = 16  # adapter rank
    alpha: AtLeast1 = 32  # LoRA scaling numerator (scale = alpha / r)
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0  # dropout on the adapters
    # the linear layers that get adapters
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        _check(bool(self.target_modules), "train.lora.target_modules", "must name at least one module", [])


@dataclass
class TrainConfig:
    """The trainer: GRPO loss options, advantages, KL, off-policy correction, optimizer, placement.

    Loss menu (``llmrl_core.objectives.grpo_loss``): ``objective`` ppo | cispo; ``clip_epsilon`` with an
    optional ``clip_epsilon_high`` (DAPO's clip-higher); ``aggregation`` token_mean | prompt_mean |
    sequence_sum (Dr.GRPO's constant normaliser, ``rollout.max_new_tokens``); ``importance_level`` token |
    sequence (GSPO); ``entropy_coeff``; ``tis`` (off-policy correction). ``advantage`` grpo | dr_grpo | rloo.
    KL to the reference model (``kl_coef > 0``): in the loss (``kl_in: loss``) or subtracted from the reward
    before advantages (``kl_in: reward``, TorchRL's ``KLRewardTransform``). ``agreement_warn``: the flow logs a
    warning when the mean |trainer - sampler| log-prob gap before the first step of an iteration exceeds it;
    with ``agreement_stop`` it stops the run there instead (the version just trained is not published).
    """

    lr: Positive = 5e-6  # AdamW learning rate
    # a resume whose optimizer/RNG state is missing is an error; true: resume from the weights with a fresh optimizer
    resume_without_state: bool = False
    steps_per_iteration: AtLeast1 = 1  # optimizer steps on each iteration's batch
    objective: Literal["ppo", "cispo"] = "ppo"
    clip_epsilon: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_epsilon_high: NonNegative | None = None  # None: symmetric clip
    importance_level: Literal["token", "sequence"] = "token"
    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    kl_coef: NonNegative = 0.0  # weight of the KL to the reference model (0: no reference model)
    kl_in: Literal["loss", "reward"] = "loss"  # the KL as a loss term, or subtracted from the reward before advantages
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # Schulman's k1, k2 or k3 estimator of the KL
    aggregation: Literal["token_mean", "prompt_mean", "sequence_sum"] = "token_mean"
    entropy_coeff: NonNegative = 0.0
    tis: TISConfig = field(default_factory=TISConfig)
    max_grad_norm: Positive = 1.0  # gradient clipping norm
    # Train only on groups whose rewards differ: an all-equal group has zero advantage, so it adds no policy
    # gradient, only tokens to the token-mean (diluting the rest) and compute. With kl_coef > 0 those groups
    # would still pull towards the reference; they are dropped all the same. Rows stay in the store.
    skip_zero_signal_groups: bool = False
    # With skip_zero_signal_groups, true: skipping saves the left-out groups' compute and changes nothing else: the
    # update is the one training every row gives (TRL's): their tokens count in the loss's mean, and a version with
    # no signal still takes the optimizer's step on zero gradients (AdamW moves along its momentum). With kl_coef or
    # entropy_coeff > 0 those rows have a gradient: every row is then trained (no saving). False: the mean is over
    # the trained groups' tokens alone, and a version with no signal leaves the weights and the optimizer as they were.
    exact_skip: bool = False
    token_budget: Annotated[int, Field(ge=16)] = (
        2048  # tokens per packed micro-batch: bounds the (tokens x vocab) logits memory
    )
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"  # auto: bf16 autocast where bf16 is native (as dtype)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    lora: LoraConfig = field(default_factory=LoraConfig)
    agreement_warn: Positive = 0.1
    agreement_stop: bool = False  # true: a gap over agreement_warn stops the run (the trained version unpublished)
    threads: NonNegativeInt = 0  # torch threads on the trainer worker (0: all cores)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # a GPU trainer is placed on a worker with resource GPU=1
    # trainer ranks, one per Dask worker: each trains on its token-balanced shard of the batch and the gradients
    # are summed over a torch.distributed group (gloo on CPU, NCCL on GPU); rank 0 publishes the weights
    data_parallel: AtLeast1 = 1
    # "module:Class": a GRPOLoss subclass the trainer optimizes (built with this section's loss options plus
    # loss_kwargs); null: GRPOLoss
    loss_class: str | None = None
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": an MCAdvantage subclass that gives the rows their advantages (built with method=advantage plus
    # advantage_kwargs, called on each batch's returns and group ids); null: MCAdvantage
    advantage_class: str | None = None
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": a RetrieveLogProb subclass the reference stage runs on the reference model (kl_coef > 0;
    # built with assistant_only=False, log_probs_full_key=("ref_log_probs", "full") plus kl_transform_kwargs);
    # null: RetrieveLogProb
    kl_transform_class: str | None = None
    kl_transform_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": a KLComputation subclass that takes the KL out of the rewards (kl_in: reward; built with
    # coeff=kl_coef plus kl_reward_kwargs, run on each batch's response tokens); null: KLComputation
    kl_reward_class: str | None = None
    kl_reward_kwargs: dict[str, Any] = field(default_factory=dict)

    def loss_options(self, max_new_tokens: int) -> dict[str, Any]:
        """The :class:`~llmrl_core.objectives.GRPOLoss` keyword options this config selects."""
        clip: float | tuple[float, float] = self.clip_epsilon
        if self.clip_epsilon_high is not None:
            clip = (self.clip_epsilon, self.clip_epsilon_high)
        options: dict[str, Any] = dict(
            clip_epsilon=clip,
            objective=self.objective,
            aggregation=self.aggregation,
            entropy_coeff=self.entropy_coeff,
            kl_estimator=self.kl_estimator,
            importance_level=self.importance_level,
        )
        if self.aggregation == "sequence_sum":
            options["norm_constant"] = float(max_new_tokens)
        if self.kl_coef > 0 and self.kl_in == "loss":
            options["kl_to_ref_coeff"] = self.kl_coef
        if self.tis.cap is not None:
            options.update(tis_cap=self.tis.cap, tis_mode=self.tis.mode, tis_level=self.tis.level)
        return options


@dataclass
class FinalEvalConfig:
    """A held-out evaluation at the end of the run: the base model (version 0) against the last version, greedy,
    on the first ``questions`` problems of ``task.eval_source`` (0 turns it off). The result is printed as
    "held-out accuracy a -> b (± s.e.)" and written like ``llmrl run evaluate``'s report."""

    questions: NonNegativeInt = 0
    samples: NonNegativeInt = 0  # sampled answers per question at rollout.temperature (0: greedy only)


@dataclass
class DaskConfig:
    """Where the stages run: a LocalCluster (rollout workers + 1 trainer) or an existing scheduler, and the flows'
    healing: after a lost worker (dead, or silent past its limit) the run starts again on new workers (a fresh local
    cluster; on a joined cluster, the workers it has then, waiting up to ``join_wait_s`` for a replacement with the
    lost worker's resources) and resumes from its last committed version, at most ``restarts`` times (0: stop at the
    first lost worker)."""

    address: str | None = None  # e.g. tcp://127.0.0.1:8786; workers declare resources ROLLOUT / TRAINER or GPU
    local_directory: str | None = None  # the Dask workers' scratch folder (default: under the run folder)
    restarts: NonNegativeInt = 2  # new attempts after a lost worker (0: stop at the first)
    join_wait_s: NonNegative = 120.0  # with `address`: how long a run (or its restart) waits for the workers it needs


@strict_config  # the run form's schema describes every setting; unknown keys are refused
@dataclass
class GRPOConfig:
    """A GRPO run: model, data, rollouts, training, iterations, storage and tracking."""

    run_id: str = "grpo-demo"  # the run: its folder, its MLflow run; the same run_id again resumes it
    model: str = "default"  # "default" (packaged SmolLM2-135M-Instruct), a folder or an `llmrl models` name
    iterations: int = 3  # policy versions to train (the run's last version number)
    seed: int = 0  # seeds the prompt order, the sampling and the trainer's RNG
    runs_dir: str | None = None  # default $LLMRL_HOME/runs
    tracking_uri: str | None = None  # default: one sqlite store per runs root (<runs_dir>/mlflow.db)
    keep_checkpoints: int = 3  # the newest N checkpoints are kept...
    keep_every: int | None = None  # ...plus every version divisible by this (e.g. 10, for evaluation curves)
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init: InitConfig = field(default_factory=InitConfig)  # a new run's start: the model, or RUN@V (a fork)
    dask: DaskConfig = field(default_factory=DaskConfig)
    final_eval: FinalEvalConfig = field(default_factory=FinalEvalConfig)
    progress: bool = True  # progress bars: iterations (flow), rollout prompts (vLLM), train micro-batches

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(
                f"iterations={self.iterations}: must be >= 1 (the run's last version; version 0 is the base model, "
                "which trains nothing): to sample or score the base model, use `llmrl run collect`"
            )
        from llmrl_core.objectives import GRPOLoss
        from llmrl_core.pipeline.components import check_components

        validate_env_config(self.env)  # names, import paths and options: before any engine starts
        check_components(self)  # the module:Class settings: importable, of the right base
        self._env_defaults()
        if self.rollout.backend == "transformers" and (self.env.agent or self.env.verifiers):
            route = "env.agent" if self.env.agent else "env.verifiers"
            raise ValueError(
                f"rollout.backend: transformers cannot serve {route}: agents talk to the engine's OpenAI-compatible "
                "endpoint, which the vLLM engine serves; use rollout.backend=vllm"
            )
        _check(
            self.keep_checkpoints > self.rollout.max_staleness,
            "keep_checkpoints",
            f"must exceed rollout.max_staleness ({self.rollout.max_staleness}): a resume re-samples the unpublished "
            "batches with the checkpoints that sampled them",
            self.keep_checkpoints,
        )

        try:  # the loss validates its own options: a bad combination fails here, before any engine starts
            GRPOLoss(None, **self.train.loss_options(self.rollout.max_new_tokens))
        except (TypeError, ValueError) as err:
            raise ValueError(f"train: {err}") from err

    def _env_defaults(self) -> None:
        """An env that brings its own prompts (``reasoning_gym``, ``countdown``, ``env.verifiers``) replaces the GSM8K
        defaults it would otherwise inherit: the prompt sources and the GSM8K prompt format. Settings the user gave
        are kept."""
        if self.env.verifiers:  # the verifiers env's own datasets (docs/verifiers.md)
            if self.data.source == DataConfig.source:
                self.data.source = "verifiers:train"
            if self.task.eval_source == TaskConfig.eval_source:
                self.task.eval_source = "verifiers:eval"
            return
        if self.env.factory is not None or self.env.name not in ("reasoning_gym", "countdown"):
            return
        from llmrl_core.envs.countdown import COUNTDOWN_SYSTEM_PROMPT
        from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
        from llmrl_core.envs.reasoning_gym_env import REASONING_GYM_SYSTEM_PROMPT

        name = self.env.name
        if self.data.source == DataConfig.source:
            self.data.source = f"{name}:train"
        if self.task.eval_source == TaskConfig.eval_source:
            self.task.eval_source = f"{name}:test"
        if self.task.system_prompt == GSM8K_SYSTEM_PROMPT:
            own = {"reasoning_gym": REASONING_GYM_SYSTEM_PROMPT, "countdown": COUNTDOWN_SYSTEM_PROMPT}
            self.task.system_prompt = own[name]
        if self.task.question_template == GSM8K_QUESTION_TEMPLATE:
            self.task.question_template = None
