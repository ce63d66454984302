"""Score a policy on GSM8K questions exactly as training sees them: same prompts, same reward parser.

``evaluate_gsm8k(engine, rows, n_samples, k_values, sampling)``:

* Prompts come from a :class:`~llmrl_core.envs.gsm8k.GSM8KEnv` in tokens mode (system prompt, the question
  rewritten by ``GSM8KPrepareQuestion``, the tokenizer's chat template with the generation prompt), so an
  evaluated prompt is token for token the prompt a training rollout gets with the same settings.
* Responses are scored by :meth:`GSM8KRewardParser.score`, the training reward: ``correct`` is exact-match
  of the first ``<answer>`` tag against the gold number, ``has_answer`` is the answer-tag rate, ``reward``
  includes the format bonus.
* Two decoding modes: ``greedy`` (temperature 0, one sample per question) and ``sampled`` (``n_samples``
  per question at ``sampling.temperature`` with ``sampling.seed``; vLLM derives a distinct seed for each of
  the ``n`` samples, so the same seed gives every policy version the same random stream).

``engine`` is a :class:`~llmrl_core.modules.backends.vllm.worker.vLLMWorker`, a ``TransformersWorker`` or a
``vllm.LLM``.
The scoring half is :func:`evaluate_prompts`, which takes any prompt ids and any ``score(text, answer_field)``
function with the parser's output keys, for tasks other than GSM8K.

``progress`` (every ``evaluate_*``): a :data:`Progress` callback, called with (answers done, answers in all) from
the start and then as the engine finishes answers (vLLM reports each finished request; the transformers engine
each batch). The engine call is the same as without it, so are the answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from llmrl_core.data.chat_templates import MODEL_TEMPLATE
from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT, GSM8KEnv
from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser, extract_tags, gold_answer, normalize_answer
from llmrl_core.evaluation.results import EvaluationResult, ModeResult, QuestionOutcome, SampleOutcome
from llmrl_core.modules.backends.types import Completion, SamplingConfig
from llmrl_core.modules.backends.vllm.engine import generate
from llmrl_core.pipeline.preflight import check_rows as check_source_rows

ScoreFn = Callable[[str, str], Mapping[str, Any]]
Progress = Callable[[int, int], None]  # (answers done, answers in the whole evaluation: every mode)
Advance = Callable[[int], None]  # a mode's runner: this many more answers are done


def check_rows(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = ("question", "answer")) -> None:
    """Raise a clear error naming the row and field when a row lacks a text field the evaluation needs (the
    preflight's check of a data source, :func:`llmrl_core.pipeline.preflight.check_rows`)."""
    if not rows:
        raise ValueError("no rows to evaluate")
    check_source_rows(rows, tuple(fields), "evaluation rows")


def gsm8k_prompt_ids(
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
    question_template: str | None = GSM8K_QUESTION_TEMPLATE,
    chat_template_name: str | None = MODEL_TEMPLATE,
    few_shot: Sequence[Mapping[str, str]] = (),
) -> list[list[int]]:
    """Token ids of each row's prompt, built by a ``GSM8KEnv`` exactly as for training (rows kept in order; the
    model's own chat template, as the flows' envs render)."""
    check_rows(rows)
    env = GSM8KEnv(
        [dict(row) for row in rows],
        batch_size=len(rows),
        shuffle=False,
        tokenizer=tokenizer,
        input_mode="tokens",
        system_prompt=system_prompt,
        question_template=question_template,
        chat_template_name=chat_template_name,
        compute_reward=False,
        few_shot=few_shot,
    )
    return [t.tolist() for t in env.reset_batch().get(("tokens", "prompt"), as_list=True)]


def sample_prompts(
    engine: Any, prompts: list[list[int]], sampling: SamplingConfig, n: int, advance: Advance | None = None
) -> list[list[Completion]]:
    """``n`` completions per prompt in one engine call (prompt ``i`` seeded with ``seed + i``); ``advance(answers)``
    as the engine finishes them."""
    report: Callable[[int, int], None] | bool = False
    if advance is not None:
        reported = [0]

        def report(done: int, total: int) -> None:  # done: the engine's count of finished answers
            if done > reported[0]:
                advance(done - reported[0])
                reported[0] = done

    if hasattr(engine, "load_weights"):  # a vLLMWorker or a TransformersWorker (a vllm.LLM has no load_weights)
        return engine.generate(prompts, sampling, n=n, progress=report)
    return generate(engine, prompts, n=n, use_tqdm=report, **sampling.vllm_kwargs())


def _score_mode(
    mode: str,
    groups: list[list[Completion]],
    answers: Sequence[str],
    score: ScoreFn,
    n: int,
    temperature: float,
) -> ModeResult:
    questions = []
    for index, (group, answer_field) in enumerate(zip(groups, answers, strict=True)):
        if len(group) != n:
            raise RuntimeError(f"{mode}: question {index} got {len(group)} samples, expected {n}")
        samples = []
        for completion in group:
            out = score(completion.text, answer_field)
            samples.append(
                SampleOutcome(
                    text=completion.text,
                    answer=extract_tags(completion.text)[1],
                    correct=bool(out["success"]),
                    has_answer=bool(out["reward_answer"]),
                    reward=float(out["reward"]),
                    num_tokens=len(completion.token_ids),
                    finish_reason=completion.finish_reason,
                    extra={k: float(v) for k, v in dict(out.get("extra") or {}).items()},
                )
            )
        questions.append(QuestionOutcome(index, normalize_answer(gold_answer(answer_field)), samples))
    return ModeResult(mode=mode, n_samples=n, temperature=temperature, questions=questions)


def evaluate_prompts(
    engine: Any,
    prompt_ids: Sequence[Sequence[int]],
    answers: Sequence[str],
    score: ScoreFn,
    *,
    n_samples: int = 4,
    k_values: Sequence[int] = (1,),
    sampling: SamplingConfig | None = None,
    greedy: bool = True,
    settings: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> EvaluationResult:
    """Sample and score every prompt: greedy (if ``greedy``) and ``n_samples`` sampled (if ``n_samples > 0``).

    ``score(text, answer_field)`` returns at least ``success``, ``reward_answer`` and ``reward`` (the keys of
    :meth:`GSM8KRewardParser.score`). ``progress``: see the module docstring.
    """
    if len(prompt_ids) != len(answers):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(answers)} answers")
    prompts = [list(p) for p in prompt_ids]

    def run_mode(name: str, cfg: SamplingConfig, n: int, advance: Advance | None) -> ModeResult:
        groups = sample_prompts(engine, prompts, cfg, n, advance)
        return _score_mode(name, groups, answers, score, n, cfg.temperature)

    return run_decoding_modes(run_mode, len(prompts), n_samples, k_values, sampling, greedy, settings, progress)


# (mode name, sampling, samples per question, the mode's progress: None when nobody follows it) -> its result; a
# runner that never calls ``advance`` reports the whole mode when it returns
ModeRunner = Callable[[str, SamplingConfig, int, Advance | None], ModeResult]


def run_decoding_modes(
    run_mode: ModeRunner,
    num_questions: int,
    n_samples: int,
    k_values: Sequence[int],
    sampling: SamplingConfig | None,
    greedy: bool,
    settings: Mapping[str, Any] | None,
    progress: Progress | None = None,
) -> EvaluationResult:
    """The greedy mode (temperature 0, one sample) if ``greedy`` and the sampled mode (``n_samples`` at
    ``sampling``) if ``n_samples > 0``, each produced by ``run_mode``, after checking the settings; the one
    driver of single-turn (:func:`evaluate_prompts`) and episode (``env_eval.evaluate_env``) evaluation.
    ``progress`` gets (0, total) before the first mode, then the answers done as the modes report them."""
    sampling = sampling or SamplingConfig(max_new_tokens=256, temperature=0.7, seed=0)
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    if not greedy and n_samples == 0:
        raise ValueError("nothing to evaluate: greedy=False and n_samples=0")
    bad_k = [k for k in k_values if not 1 <= k <= max(n_samples, 1)]
    if bad_k:
        raise ValueError(f"k_values {bad_k} must lie in 1..n_samples ({n_samples})")
    if n_samples > 0 and sampling.temperature == 0:
        raise ValueError("sampled mode needs a temperature > 0 (greedy is its own mode)")
    planned = [("greedy", replace(sampling, temperature=0.0, top_p=1.0), 1)] if greedy else []
    planned += [("sampled", sampling, n_samples)] if n_samples > 0 else []
    total = num_questions * sum(n for _, _, n in planned)
    done = 0

    def advance(answers: int) -> None:
        nonlocal done
        done += answers
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    modes: dict[str, ModeResult] = {}
    for name, cfg, n in planned:
        before = done
        modes[name] = run_mode(name, cfg, n, advance if progress is not None else None)
        if done < before + num_questions * n:  # a runner that does not report within its mode
            advance(before + num_questions * n - done)
    info = {
        "num_questions": num_questions,
        "n_samples": n_samples,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_new_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        **dict(settings or {}),
    }
    return EvaluationResult(modes=modes, k_values=sorted(set(k_values)), settings=info)


def evaluate_gsm8k(
    engine: Any,
    rows: Sequence[Mapping[str, Any]],
    n_samples: int = 4,
    k_values: Sequence[int] = (1,),
    sampling: SamplingConfig | None = None,
    *,
    greedy: bool = True,
    system_prompt: str | None = GSM8K_SYSTEM_PROMPT,
    question_template: str | None = GSM8K_QUESTION_TEMPLATE,
    format_reward: float = 0.1,
    correct_reward: float = 1.0,
    few_shot: Sequence[Mapping[str, str]] = (),
    task: str = "gsm8k",
    progress: Progress | None = None,
) -> EvaluationResult:
    """Accuracy, answer-tag rate, mean reward and pass@k of ``engine`` on GSM8K ``rows`` (question/answer dicts).

    Prompts and rewards are the training ones (see the module docstring); pass ``system_prompt`` /
    ``question_template`` / ``few_shot`` / reward values when the run trained with other settings. Any rows in
    GSM8K form work (e.g. generated arithmetic); ``task`` names them in the result's settings.
    """
    tokenizer = engine.get_tokenizer()
    prompt_ids = gsm8k_prompt_ids(
        tokenizer, rows, system_prompt=system_prompt, question_template=question_template, few_shot=few_shot
    )
    parser = GSM8KRewardParser(tokenizer=tokenizer, format_reward=format_reward, correct_reward=correct_reward)
    settings = {
        "task": task,
        "few_shot": [dict(e) for e in few_shot],
        "system_prompt": system_prompt,
        "question_template": question_template,
        "format_reward": format_reward,
        "correct_reward": correct_reward,
    }
    return evaluate_prompts(
        engine,
        prompt_ids,
        [str(row["answer"]) for row in rows],
        parser.score,
        n_samples=n_samples,
        k_values=k_values,
        sampling=sampling,
        greedy=greedy,
        settings=settings,
        progress=progress,
    )


def evaluate_ifeval(
    engine: Any,
    rows: Sequence[Mapping[str, Any]],
    n_samples: int = 4,
    k_values: Sequence[int] = (1,),
    sampling: SamplingConfig | None = None,
    *,
    greedy: bool = True,
    task: str = "ifeval",
    progress: Progress | None = None,
) -> EvaluationResult:
    """IFEval's four metrics (prompt/instruction level, strict/loose), the reward, and ``accuracy`` = prompt-level
    strict, of ``engine`` on IFEval ``rows`` (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``), with the
    prompts and scorer of :class:`~llmrl_core.envs.ifeval.IFEvalEnv` (as the GRPO flow's ``env.name=ifeval``)."""
    from llmrl_core.envs.ifeval import IFEvalEnv, IfEvalScorer
    from llmrl_core.envs.ifeval.reward import extract_blocks, metric_components
    from llmrl_core.envs.ifeval.scorer import METRIC_NAMES

    check_rows(rows, fields=("prompt",))
    env = IFEvalEnv(
        [dict(row) for row in rows],
        batch_size=len(rows),
        shuffle=False,
        tokenizer=engine.get_tokenizer(),
        input_mode="tokens",
        chat_template_name=MODEL_TEMPLATE,  # as the flows' env renders
        compute_reward=False,
    )
    prompt_ids = [t.tolist() for t in env.reset_batch().get(("tokens", "prompt"), as_list=True)]
    scorer = IfEvalScorer()

    def score(text: str, index: str) -> dict[str, Any]:
        row = rows[int(index)]
        result, reward = scorer.score_text(text, row["instruction_id_list"], row["kwargs"])
        return {
            "success": bool(result.prompt_level_strict_acc),
            "reward_answer": len(extract_blocks(text, "answer")) == 1,
            "reward": reward,
            "extra": dict(zip(METRIC_NAMES, metric_components(result), strict=True)),
        }

    return evaluate_prompts(
        engine,
        prompt_ids,
        [str(i) for i in range(len(rows))],
        score,
        n_samples=n_samples,
        k_values=k_values,
        sampling=sampling,
        greedy=greedy,
        settings={"task": task},
        progress=progress,
    )
