"""llmrl_core.evaluation: pass@k against brute-force enumeration, standard errors by hand, GSM8K scoring and
prompts against an independent rendering, the report table and PNG (no engine: a scripted sampler)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
from llmrl_core.evaluation import (
    evaluate_gsm8k,
    format_rows,
    gsm8k_prompt_ids,
    load_result,
    markdown_table,
    mean_stderr,
    paired_difference,
    pass_at_k,
    pass_at_k_estimate,
    plot_curves,
    report_rows,
    save_result,
    side_by_side,
)
from llmrl_core.modules.backends.types import Completion, SamplingConfig


def _brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of the k-subsets of n samples (the first c correct) that hold at least one correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(i < c for i in subset) for subset in subsets)
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_special_values_and_large_n():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # n - c < k: every 5-subset holds a correct sample
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct
    # n = 200, c = 3, k = 100: 1 - C(197,100)/C(200,100) = 1 - (100*99*98)/(200*199*198) by hand
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - (100 * 99 * 98) / (200 * 199 * 198), rel=1e-12)
    for bad in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(*bad)


def test_mean_stderr_by_hand():
    est = mean_stderr([1, 0, 0, 1, 1])
    # mean 0.6; sample variance (3 * 0.4^2 + 2 * 0.6^2) / 4 = 0.3; se = sqrt(0.3 / 5)
    assert est.mean == pytest.approx(0.6) and est.stderr == pytest.approx(math.sqrt(0.3 / 5)) and est.count == 5
    # a proportion with one sample per question: se = sqrt(p (1 - p) / (Q - 1))
    assert est.stderr == pytest.approx(math.sqrt(0.6 * 0.4 / 4))
    assert math.isnan(mean_stderr([0.5]).stderr)
    assert mean_stderr([2.0, 2.0, 2.0]).stderr == 0.0
    with pytest.raises(ValueError, match="at least one"):
        mean_stderr([])


def test_pass_at_k_estimate_and_paired_difference_by_hand():
    # 3 questions, n = 4 samples, correct counts 0, 2, 4; k = 2: per question 0, 1 - C(2,2)/C(4,2) = 5/6, 1
    est = pass_at_k_estimate([0, 2, 4], 4, 2)
    values = [0.0, 5 / 6, 1.0]
    mean = sum(values) / 3
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / 2 / 3)
    assert est.mean == pytest.approx(mean) and est.stderr == pytest.approx(se)
    diff = paired_difference([1, 1, 0, 1], [0, 1, 0, 0])  # differences 1, 0, 0, 1
    assert diff.mean == pytest.approx(0.5) and diff.stderr == pytest.approx(math.sqrt((4 * 0.25) / 3 / 4))
    with pytest.raises(ValueError, match="same questions"):
        paired_difference([1, 0], [1])


ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs are in 2 boxes?", "answer": "12 * 2 = 24\n#### 24"},
    {"question": "Sara pays $1,200 for 3 chairs. Price of one chair?", "answer": "1200 / 3 = 400\n#### 400"},
]
# Scripted responses per question: greedy first, then the sampled ones (n = 4).
SCRIPT = {
    0: ["<answer>7</answer>", "<answer>7</answer>", "<answer>8</answer>", "7 apples", "<answer>7.00</answer>"],
    1: ["It is 24.", "<answer>42</answer>", "<answer>24</answer>", "no idea", "<answer></answer>"],
    2: ["<answer>$400</answer>", "<answer>300</answer>", "400", "<answer>4OO</answer>", "<think>x</think>"],
}


class ScriptedWorker:
    """Stands in for a vLLMWorker: a real tokenizer, completions from SCRIPT, and a record of each call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.llm = None
        self.calls = []

    def get_tokenizer(self):
        return self.tokenizer

    def load_weights(self, weights, version):
        raise AssertionError("not used")

    def generate(self, prompts, sampling, n=1, progress=False):
        self.calls.append((prompts, sampling, n))
        out = []
        for prompt in prompts:
            index = self.prompt_index[tuple(prompt)]
            texts = SCRIPT[index][:1] if n == 1 else SCRIPT[index][1 : 1 + n]
            reason = "stop" if n == 1 else "length"
            out.append([Completion(list(prompt), [1] * (len(t) // 4 + 1), [], t, reason) for t in texts])
            if callable(progress):  # as the engines report: answers done so far, after each finished prompt
                progress(len(out) * n, len(prompts) * n)
        return out


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_prompts_are_the_training_prompts(tokenizer):
    ids = gsm8k_prompt_ids(tokenizer, ROWS)
    for row, prompt in zip(ROWS, ids, strict=True):
        messages = [
            {"role": "system", "content": GSM8K_SYSTEM_PROMPT},
            {"role": "user", "content": GSM8K_QUESTION_TEMPLATE.format(question=row["question"])},
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert prompt == tokenizer(text, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match=r"row 1 \(the 2nd row\) has no field 'answer'"):
        gsm8k_prompt_ids(tokenizer, [ROWS[0], {"question": "q"}])


def test_evaluate_gsm8k_scores_with_the_training_reward(tokenizer, tmp_path):
    worker = ScriptedWorker(tokenizer)
    worker.prompt_index = {tuple(p): i for i, p in enumerate(gsm8k_prompt_ids(tokenizer, ROWS))}
    sampling = SamplingConfig(max_new_tokens=64, temperature=0.7, seed=3)
    result = evaluate_gsm8k(worker, ROWS, n_samples=4, k_values=[1, 2, 4], sampling=sampling)
    (_, greedy_cfg, greedy_n), (_, sampled_cfg, sampled_n) = worker.calls
    assert greedy_n == 1 and greedy_cfg.temperature == 0.0 and greedy_cfg.max_new_tokens == 64
    assert sampled_n == 4 and sampled_cfg.temperature == 0.7 and sampled_cfg.seed == 3

    greedy = result.modes["greedy"]
    # greedy: q0 "<answer>7</answer>" right; q1 no tag; q2 "$400" right -> per question 1, 0, 1
    assert greedy.per_question("accuracy") == [1.0, 0.0, 1.0]
    assert greedy.per_question("tag_rate") == [1.0, 0.0, 1.0]
    assert greedy.per_question("mean_reward") == [1.0, 0.0, 1.0]
    acc = greedy.estimate("accuracy")
    assert acc.mean == pytest.approx(2 / 3) and acc.stderr == pytest.approx(math.sqrt((2 / 3) * (1 / 3) / 2))

    sampled = result.modes["sampled"]
    # q0: 7 right, 8 tag-only, no tag, 7.00 right -> 2 correct, 3 tags, rewards 1 + 0.1 + 0 + 1
    # q1: 42 tag-only, 24 right, no tag, empty tag (no answer) -> 1 correct, 2 tags, rewards 0.1 + 1 + 0 + 0
    # q2: 300 tag-only, no tag, "4OO" tag-only, think only -> 0 correct, 2 tags, rewards 0.1 + 0 + 0.1 + 0
    assert [q.num_correct for q in sampled.questions] == [2, 1, 0]
    assert sampled.per_question("accuracy") == [0.5, 0.25, 0.0]
    assert sampled.per_question("tag_rate") == [0.75, 0.5, 0.5]
    assert sampled.per_question("mean_reward") == pytest.approx([2.1 / 4, 1.1 / 4, 0.2 / 4])
    assert sampled.per_question("truncated_rate") == [1.0, 1.0, 1.0]
    # pass@2 with n = 4: c = 2 -> 1 - C(2,2)/C(4,2) = 5/6; c = 1 -> 1 - C(3,2)/C(4,2) = 1/2; c = 0 -> 0
    assert sampled.per_question("pass@2") == pytest.approx([5 / 6, 1 / 2, 0.0])
    assert sampled.estimate("pass@4").mean == pytest.approx(2 / 3)
    summary = result.summary()
    assert summary["sampled/pass_at_1"] == pytest.approx(0.25) == summary["sampled/accuracy"]
    assert summary["greedy/pass_at_1"] == pytest.approx(2 / 3) and "greedy/pass_at_2" not in summary
    assert summary["sampled/tag_rate_se"] == pytest.approx(mean_stderr([0.75, 0.5, 0.5]).stderr)
    assert [q.gold for q in sampled.questions] == ["7", "24", "400"]
    assert sampled.questions[0].samples[3].answer == "7.00"

    path = save_result(result, tmp_path / "v.json")
    again = load_result(path)
    assert again.summary() == pytest.approx(summary, nan_ok=True)
    (tmp_path / "bad.json").write_text('{"modes": {"greedy": {"mode": "greedy"}}, "k_values": []}')
    with pytest.raises(ValueError, match=r"bad\.json: malformed evaluation result"):
        load_result(tmp_path / "bad.json")

    with pytest.raises(ValueError, match="k_values"):
        evaluate_gsm8k(worker, ROWS, n_samples=2, k_values=[4], sampling=sampling)
    with pytest.raises(ValueError, match="temperature > 0"):
        evaluate_gsm8k(worker, ROWS, n_samples=2, sampling=SamplingConfig(temperature=0.0))


def test_report_rows_paired_delta_markdown_and_png(tokenizer, tmp_path):
    worker = ScriptedWorker(tokenizer)
    worker.prompt_index = {tuple(p): i for i, p in enumerate(gsm8k_prompt_ids(tokenizer, ROWS))}
    result = evaluate_gsm8k(worker, ROWS, n_samples=4, k_values=[1, 4], sampling=SamplingConfig(temperature=0.7))
    baseline = load_result(save_result(result, tmp_path / "v0.json"))
    # version 2: make every greedy answer of question 1 right (paired delta +1 on one question of three)
    improved = load_result(save_result(result, tmp_path / "v2.json"))
    sample = improved.modes["greedy"].questions[1].samples[0]
    sample.correct, sample.has_answer, sample.reward = True, True, 1.0
    rows = report_rows({2: improved, 0: baseline})
    assert [(r["version"], r["mode"]) for r in rows] == [(0, "greedy"), (0, "sampled"), (2, "greedy"), (2, "sampled")]
    v2_greedy = rows[2]
    assert v2_greedy["accuracy"] == pytest.approx(1.0) and v2_greedy["delta_accuracy"] == pytest.approx(1 / 3)
    # differences 0, 1, 0: se = sqrt(((1/3)^2 * 2 + (2/3)^2) / 2 / 3)
    se = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2 / 3)
    assert v2_greedy["delta_accuracy_se"] == pytest.approx(se) and v2_greedy["z"] == pytest.approx((1 / 3) / se)
    assert rows[0]["delta_accuracy"] == 0.0 and rows[0]["z"] == 0.0
    assert "pass_at_4" in rows[1] and "pass_at_4" not in rows[0]
    text = format_rows(rows)
    assert text[2]["accuracy"] == "1.000 ± 0.000" and text[1]["pass@4"].startswith("0.667 ± ")
    table = markdown_table(rows)
    assert table.splitlines()[0].startswith("| version | mode |") and len(table.splitlines()) == 6
    png = plot_curves(rows, tmp_path / "out" / "curves.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p.name for p in png.parent.iterdir()] == ["curves.png"]
    with pytest.raises(ValueError, match="baseline version 5"):
        report_rows({0: baseline}, baseline=5)
    # the same questions answered by each version, side by side (greedy, the first sample)
    pairs = side_by_side({2: improved, 0: baseline}, [r["question"] for r in ROWS], text_chars=30)
    assert len(pairs) == len(ROWS) and [p["gold"] for p in pairs] == [
        q.gold for q in baseline.modes["greedy"].questions
    ]
    for row, before, after in zip(
        pairs, baseline.modes["greedy"].questions, improved.modes["greedy"].questions, strict=True
    ):
        assert list(row)[:2] == ["question", "gold"] and len(row["question"]) <= 30
        assert row["v0 answer"] == f"{'✓' if before.samples[0].correct else '✗'} {before.samples[0].answer}"
        assert (
            row["v2 reward"] == round(after.samples[0].reward, 3) and row["v0 tokens"] == before.samples[0].num_tokens
        )
    assert pairs[1]["v2 answer"].startswith("✓") and pairs[1]["v2 reward"] == 1.0
    assert side_by_side({0: baseline}, limit=1)[0]["question"] == 0  # no texts given: the question's index


def test_verdict_names_the_best_version_and_whether_it_clears_three_standard_errors():
    from llmrl_core.evaluation.report import verdict_lines

    def row(version, mode, acc, delta, se):
        z = delta / se if se else 0.0
        return {
            "version": version,
            "mode": mode,
            "accuracy": acc,
            "delta_accuracy": delta,
            "delta_accuracy_se": se,
            "z": z,
            "num_questions": 200,
        }

    rows = [
        row(0, "greedy", 0.30, 0.0, 0.0),
        row(0, "sampled", 0.25, 0.0, 0.0),
        row(10, "greedy", 0.36, 0.06, 0.02),
        row(10, "sampled", 0.27, 0.02, 0.01),
        row(20, "greedy", 0.40, 0.10, 0.04),
        row(20, "sampled", 0.26, 0.01, 0.01),
    ]
    greedy, sampled = verdict_lines(rows)
    # z: v10 = 3.0, v20 = 2.5 -> v10 is the best by standard errors, not by raw accuracy
    assert greedy.startswith("greedy: best version 10 accuracy 0.360 vs 0.300 at version 0: +0.060 ± 0.020")
    assert "z = 3.00, clears 3 standard errors" in greedy and "200 questions" in greedy
    assert sampled.startswith("sampled: best version 10") and "z = 2.00, does not clear" in sampled
    assert verdict_lines(rows[:2]) == []  # the baseline alone: nothing to compare


def test_a_long_evaluation_reports_its_progress_as_the_engine_finishes_answers(tokenizer):
    """With a progress callback, each mode is still one engine call (the same call, so the same answers) and the
    counts come from the engine as it finishes answers: (0, total) first, then rising to (total, total)."""
    worker = ScriptedWorker(tokenizer)
    rows = [ROWS[i % len(ROWS)] for i in range(40)]
    worker.prompt_index = {tuple(p): i % len(ROWS) for i, p in enumerate(gsm8k_prompt_ids(tokenizer, rows))}
    sampling = SamplingConfig(max_new_tokens=64, temperature=0.7, seed=3)
    seen = []
    result = evaluate_gsm8k(worker, rows, n_samples=2, sampling=sampling, progress=lambda d, t: seen.append((d, t)))
    total = 40 * (1 + 2)
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert {t for _, t in seen} == {total}
    done = [d for d, _ in seen]
    assert done == sorted(done) and len(set(done)) == len(done) >= 6  # several counts within each mode
    assert [(len(p), s.seed, n) for p, s, n in worker.calls] == [(40, 3, 1), (40, 3, 2)]  # one call per mode
    worker.calls.clear()
    plain = evaluate_gsm8k(worker, rows, n_samples=2, sampling=sampling)
    assert len(worker.calls) == 2
    assert plain.summary() == pytest.approx(result.summary(), nan_ok=True)


def test_vllm_reports_finished_answers_through_the_progress_callback(vllm_engine_fp32):
    """The callback rides on vLLM's own per-request progress (``use_tqdm``): counts of finished answers, the last
    one every answer, nothing printed; the answers are those of the same call without it."""
    from llmrl_core.modules.backends.vllm.engine import generate

    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    seen = []
    with_bar = generate(vllm_engine_fp32, prompts, max_tokens=8, n=2, seed=1, use_tqdm=lambda d, t: seen.append(d))
    plain = generate(vllm_engine_fp32, prompts, max_tokens=8, n=2, seed=1)
    assert seen[0] == 0 and seen[-1] == 6 and seen == sorted(seen)
    assert [[c.token_ids for c in g] for g in with_bar] == [[c.token_ids for c in g] for g in plain]
