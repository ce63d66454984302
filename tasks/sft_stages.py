"""The SFT stages as thin Prefect tasks: prepare the training set (a chat dataset, or stored trajectories kept by
``TopKRewardSelector``), and the resident trainer's SFT objective (training itself: :mod:`tasks.epoch_stages`).

Chats are tokenized with ``Conversation.apply_chat_template(..., return_assistant_tokens_mask=True)``: the prompt is
everything before the first assistant token, the loss covers assistant tokens only (user / tool turns of a
multi-turn chat stay in the response but are masked out). Selected trajectories keep their stored tokens and
``response_mask``. Both become one training-set file (:mod:`runtime.train_data`) that the trainer reads by path;
the selected rows are also written, with their original run and version, to the run's own ``selected/`` store
so lineage can name exactly what was trained on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect import task

from llmrl_core.builtin_data import gsm8k_gold, gsm8k_path
from llmrl_core.data.conversation import Conversation
from llmrl_core.envs.data_sources import open_source
from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
from llmrl_core.objectives import TopKRewardSelector
from llmrl_core.pipeline.sft_config import SFTConfig
from llmrl_core.trainer.batch import TrainSample
from runtime.sft_actor import TrainerSetup
from runtime.train_data import write_samples
from storage.layout import RunLayout
from storage.lineage import DataRef, LineageRecorder
from storage.schema import table_to_records
from storage.trajectories import TrajectoryStore
from tasks.epoch_runs import log_training_set
from tasks.grpo_stages import STAGE

_CALCULATOR = re.compile(r"<<[^>]*>>")


def dataset_path(source: str) -> Path:
    """``gsm8k:SPLIT`` names a shipped split; anything else is a .jsonl / .parquet path."""
    path = gsm8k_path(source.split(":", 1)[1]) if source.startswith("gsm8k:") else Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"data.source {source!r}: no such file (use gsm8k:train or a .jsonl/.parquet path)")
    return path


def env_prompt(cfg: SFTConfig, env: Any, row: dict[str, Any]) -> list[dict[str, str]]:
    """The messages ``env`` (built from the run's ``env`` + ``task`` sections) opens an episode of ``row`` with."""
    env.reset([{**row, "query": row[cfg.env.prompt_field]}])
    return [{"role": m.role, "content": m.text} for m in env.slots[0].history.messages]


def gsm8k_chat(
    question: str, answer: str, fmt: str, prompt: list[dict[str, str]] | None = None
) -> list[dict[str, str]]:
    """A GSM8K row as a chat: ``tags`` puts ``<think>``/``<answer>`` tags after ``prompt`` (default: the GSM8K
    system prompt and question template of the GRPO defaults); ``plain`` is verbatim."""
    if fmt == "plain":
        return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    reasoning = _CALCULATOR.sub("", answer.rsplit("####", 1)[0]).strip()
    target = f"<think>{reasoning}</think>\n<answer>{gsm8k_gold(answer)}</answer>" if reasoning else None
    if prompt is None:
        prompt = [
            {"role": "system", "content": GSM8K_SYSTEM_PROMPT},
            {"role": "user", "content": GSM8K_QUESTION_TEMPLATE.format(question=question)},
        ]
    return [*prompt, {"role": "assistant", "content": target or f"<answer>{gsm8k_gold(answer)}</answer>"}]


def row_chat(row: dict[str, Any], cfg: SFTConfig, where: str, env: Any = None) -> list[dict[str, Any]]:
    """The chat of one dataset row: its ``messages_key`` list, else its question/answer fields (prompted by
    ``env``, the run's env in history mode, when given)."""
    key = cfg.data.messages_key
    if key in row:
        chat = row[key]
        if not isinstance(chat, list) or not all(isinstance(m, dict) for m in chat):
            raise ValueError(f"{where}: field {key!r} must be a list of {{role, content}} objects")
        return chat
    if "question" in row and "answer" in row:
        prompt = env_prompt(cfg, env, row) if env is not None and cfg.data.gsm8k_format == "tags" else None
        return gsm8k_chat(str(row["question"]), str(row["answer"]), cfg.data.gsm8k_format, prompt)
    raise ValueError(f"{where}: no {key!r} field and no question/answer fields (fields: {sorted(row)})")


def tokenize_chat(chat: list[dict[str, Any]], tokenizer: Any, max_length: int, where: str) -> tuple[TrainSample, bool]:
    """A train sample from a chat (loss on assistant tokens only); True when it was truncated to ``max_length``."""
    try:
        rendered = Conversation.from_chats(chat).apply_chat_template(
            tokenizer, add_generation_prompt=False, return_assistant_tokens_mask=True
        )
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{where}: cannot render the chat ({err})") from err
    ids = rendered.input_ids.tolist()
    mask = [bool(m) for m in rendered.assistant_masks.tolist()]
    if True not in mask:
        raise ValueError(f"{where}: the chat has no assistant message to train on")
    start = max(1, mask.index(True))
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    if start >= len(ids) or not any(mask[start:]):
        raise ValueError(f"{where}: its prompt fills data.max_length={max_length}: no assistant token left")
    sample = TrainSample(prompt_ids=ids[:start], response_ids=ids[start:], response_mask=mask[start:], sample_id=where)
    return sample, truncated


@task(name="prepare-sft-dataset", retries=1, **STAGE)
def prepare_dataset(cfg: SFTConfig, model_path: str, layout: RunLayout) -> dict[str, Any]:
    """Tokenize the chat dataset into the run's training-set file (in its data store); returns where it is, its
    sha256 and counts."""
    from transformers import AutoTokenizer

    path = dataset_path(cfg.data.source)
    rows = open_source(str(path))
    n = len(rows) if cfg.data.limit is None else min(cfg.data.limit, len(rows))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    samples, truncated = [], 0
    from llmrl_core.pipeline.env_config import build_env

    env = build_env(cfg.env, cfg.task, None, input_mode="history")  # prompts of question/answer rows
    try:
        for i in range(n):
            where = f"{path}: row {i}"
            sample, cut = tokenize_chat(row_chat(rows[i], cfg, where, env), tokenizer, cfg.data.max_length, where)
            samples.append(sample)
            truncated += cut
    finally:
        env.close()
    out = write_samples(layout.data_location("sft-data", "samples.parquet"), samples, [s.sample_id for s in samples])
    return {
        "samples": out.location,
        "samples_sha256": out.sha256,
        "rows": n,
        "truncated": truncated,
        "source": str(path),
        "loss_tokens": sum(sum(s.response_mask) for s in samples),
    }


@task(name="select-trajectories", retries=1, **STAGE)
def select_trajectories(cfg: SFTConfig, store_uri: str, layout: RunLayout) -> dict[str, Any]:
    """Keep the top-k responses of each group of the chosen versions; write them (selected store + training set,
    in the run's data store)."""
    t = cfg.trajectories
    source, selected_store = TrajectoryStore(store_uri), TrajectoryStore(layout.data_location("selected"))
    versions = source.chosen_versions(t.run_id, t.versions)
    selector = TopKRewardSelector(topk_size=t.topk, above_median=t.above_median)
    samples, kept = [], []
    for version in versions:
        table = source.read_table(t.run_id, version=version)
        if table.num_rows == 0:
            raise ValueError(f"run {t.run_id!r} has no trajectories for version {version} in {store_uri}")
        chosen = selector.transform_table(table)
        selected_store.delete_partition(t.run_id, version)
        kept.append({"version": version, "rows": table.num_rows, "selected": chosen.num_rows})
        if chosen.num_rows == 0:
            continue
        selected_store.write_shard(t.run_id, version, 0, chosen)
        for r in table_to_records(chosen):
            label = f"{r.run_id}/v{r.policy_version}/{r.group_id}#{r.sample_index}"
            samples.append(TrainSample(r.prompt_tokens, r.response_tokens, r.response_mask, sample_id=label))
    if not samples:
        raise ValueError(
            f"no trajectory of run {t.run_id!r} versions {versions} was selected: every group's rewards are equal "
            "(or none is above its median); nothing to imitate"
        )
    out = write_samples(layout.data_location("sft-data", "samples.parquet"), samples, [s.sample_id for s in samples])
    return {
        "samples": out.location,
        "samples_sha256": out.sha256,
        "rows": len(samples),
        "versions": kept,
        "selected_store": selected_store.uri,
        "loss_tokens": sum(sum(s.response_mask) for s in samples),
    }


def trainer_setup(cfg: SFTConfig) -> TrainerSetup:
    """The resident trainer of an SFT run (``SFTLoss`` with TorchRL's option names)."""
    t = cfg.train
    options = dict(
        loss_function=t.loss_function,
        normalize_by_seq_length=t.normalize_by_seq_length,
        beta=t.beta,
        kl_to_ref_coeff=t.kl_to_ref_coeff if t.kl_to_ref_coeff > 0 else None,
    )
    return TrainerSetup.for_run(cfg, "sft", options, ref_model=t.kl_to_ref_coeff > 0 or t.loss_function == "minor_sft")


def log_data(cfg: SFTConfig, data: dict[str, Any], lineage: LineageRecorder, store_uri: str) -> list[DataRef]:
    """Record what is trained on: the dataset (or source and selected partitions) and the tokenized file."""
    if cfg.source == "dataset":
        refs = [lineage.log_training_dataset(data["source"], num_rows=data["rows"])]
    else:
        run = cfg.trajectories.run_id
        source, selected = TrajectoryStore(store_uri), TrajectoryStore(data["selected_store"])
        for v in data["versions"]:
            lineage.log_trajectory_partition(source, v["version"], run_id=run, context="source")
        refs = [
            lineage.log_trajectory_partition(selected, v["version"], run_id=run, context="training")
            for v in data["versions"]
            if v["selected"]
        ]
    refs.append(log_training_set(lineage, data, data["rows"]))
    return refs
