"""The evaluation report over policy versions: a table (numbers and formatted text) and a curve PNG.

Each row is one (policy version, decoding mode) with accuracy, answer-tag rate, mean reward, mean length
and pass@k, each with its standard error, plus the change in accuracy against the baseline version as a
*paired* difference over the same questions (``delta_accuracy`` ± ``delta_accuracy_se`` and ``z``, the
number of standard errors). The PNG plots accuracy, tag rate, mean reward and pass@k against the version,
one line per mode, with ±1 standard-error bars. Files are written atomically (temp file + rename).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmrl_core.evaluation.results import EvaluationResult
from llmrl_core.evaluation.statistics import paired_difference

TABLE_METRICS = ("accuracy", "tag_rate", "mean_reward", "mean_length", "truncated_rate")
TOOL_METRICS = ("tool_call_rate", "tool_success_rate", "turns")  # shown when the evaluation played a tool env


def report_rows(results: Mapping[int, EvaluationResult], baseline: int | None = None) -> list[dict[str, Any]]:
    """Numeric rows, one per (version, mode), sorted by version; ``baseline`` defaults to the lowest version."""
    if not results:
        raise ValueError("no evaluation results to report")
    versions = sorted(results)
    baseline = versions[0] if baseline is None else baseline
    if baseline not in results:
        raise ValueError(f"baseline version {baseline} was not evaluated (have {versions})")
    rows: list[dict[str, Any]] = []
    for version in versions:
        result = results[version]
        for mode_name, mode in result.modes.items():
            row: dict[str, Any] = {"version": version, "mode": mode_name, **mode.metrics(result.k_values)}
            row["num_questions"] = int(row["num_questions"])
            row["n_samples"] = int(row["n_samples"])
            base_mode = results[baseline].modes.get(mode_name)
            if base_mode is not None and len(base_mode.questions) == len(mode.questions):
                diff = paired_difference(mode.per_question("accuracy"), base_mode.per_question("accuracy"))
                row["delta_accuracy"] = diff.mean
                row["delta_accuracy_se"] = diff.stderr
                row["z"] = diff.mean / diff.stderr if diff.stderr > 0 else (0.0 if diff.mean == 0 else math.inf)
            rows.append(row)
    return rows


def side_by_side(
    results: Mapping[int, EvaluationResult],
    questions: Sequence[str] = (),
    limit: int = 50,
    text_chars: int = 200,
) -> list[dict[str, Any]]:
    """The same held-out questions answered by each version, one row per question (the first ``limit``): the
    question (from ``questions``, by index, when given), its gold answer, then for each version its first answer of
    the greedy mode (else of the first mode every result has): the parsed answer, right or wrong, the reward, the
    length in tokens and the response's first ``text_chars`` characters."""
    if not results:
        return []
    versions = sorted(results)
    common = [m for m in results[versions[0]].modes if all(m in results[v].modes for v in versions)]
    if not common:
        return []
    mode = "greedy" if "greedy" in common else common[0]
    by_version = {v: {q.index: q for q in results[v].modes[mode].questions} for v in versions}
    rows = []
    for index in sorted(by_version[versions[0]])[:limit]:
        first = by_version[versions[0]][index]
        row: dict[str, Any] = {"question": _clip(questions[index], text_chars) if index < len(questions) else index}
        row["gold"] = first.gold
        for v in versions:
            outcome = by_version[v].get(index)
            sample = outcome.samples[0] if outcome is not None and outcome.samples else None
            if sample is None:
                row.update({f"v{v} answer": "", f"v{v} reward": None, f"v{v} tokens": None, f"v{v} response": ""})
                continue
            row[f"v{v} answer"] = f"{'✓' if sample.correct else '✗'} {sample.answer}"
            row[f"v{v} reward"] = round(sample.reward, 3)
            row[f"v{v} tokens"] = sample.num_tokens
            row[f"v{v} response"] = _clip(sample.text, text_chars)
        rows.append(row)
    return rows


def _clip(text: str, chars: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _pm(mean: float, se: float | None) -> str:
    if se is None or math.isnan(se):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {se:.3f}"


def format_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Rows as text columns (``mean ± se``), for a Prefect table artifact or a markdown table."""
    formatted = []
    for row in rows:
        out = {
            "version": str(row["version"]),
            "mode": row["mode"],
            "questions": str(row["num_questions"]),
            "samples/q": str(row["n_samples"]),
        }
        for metric in TABLE_METRICS:
            out[metric] = _pm(row[metric], row.get(f"{metric}_se"))
        for metric in TOOL_METRICS:
            if metric in row:
                out[metric] = _pm(row[metric], row.get(f"{metric}_se"))
        for key in sorted(k for k in row if k.startswith("pass_at_") and not k.endswith("_se")):
            out[key.replace("pass_at_", "pass@")] = _pm(row[key], row.get(f"{key}_se"))
        if "delta_accuracy" in row:
            out["Δ accuracy vs baseline"] = _pm(row["delta_accuracy"], row["delta_accuracy_se"])
            out["z"] = f"{row['z']:.2f}"
        formatted.append(out)
    return formatted


def verdict_lines(rows: Sequence[Mapping[str, Any]], threshold: float = 3.0) -> list[str]:
    """One line per decoding mode: the version with the largest paired accuracy gain over the baseline, by how
    much (± its standard error, and z), and whether that clears ``threshold`` standard errors."""
    lines = []
    for mode in dict.fromkeys(row["mode"] for row in rows):
        mode_rows = [r for r in rows if r["mode"] == mode and "delta_accuracy" in r]
        if len(mode_rows) < 2:
            continue
        base = mode_rows[0]
        best = max(mode_rows[1:], key=lambda r: (r["z"], r["version"]))
        verdict = "clears" if best["z"] >= threshold else "does not clear"
        lines.append(
            f"{mode}: best version {best['version']} accuracy {best['accuracy']:.3f} vs {base['accuracy']:.3f} "
            f"at version {base['version']}: {best['delta_accuracy']:+.3f} ± {best['delta_accuracy_se']:.3f} "
            f"(z = {best['z']:.2f}, {verdict} {threshold:g} standard errors; paired over "
            f"{best['num_questions']} questions)"
        )
    return lines


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of :func:`format_rows` output (columns from the union of the rows' keys)."""
    text_rows = format_rows(rows)
    columns: list[str] = []
    for row in text_rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in text_rows]
    return "\n".join(lines) + "\n"


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str = "") -> Path:
    """Write a PNG of accuracy, tag rate, mean reward and pass@k against the policy version (±1 s.e. bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pass_keys = sorted(
        {k for r in rows for k in r if k.startswith("pass_at_") and not k.endswith("_se")},
        key=lambda k: int(k.removeprefix("pass_at_")),
    )
    panels = [("accuracy", "exact accuracy"), ("tag_rate", "answer-tag rate"), ("mean_reward", "mean reward")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    modes = sorted({r["mode"] for r in rows})
    for ax, (metric, label) in zip(axes[:3], panels, strict=True):
        for mode in modes:
            sel = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["version"])
            ax.errorbar(
                [r["version"] for r in sel],
                [r[metric] for r in sel],
                yerr=[_finite(r.get(f"{metric}_se")) for r in sel],
                marker="o",
                capsize=3,
                label=mode,
            )
        ax.set_title(label)
        ax.set_xlabel("policy version")
        ax.grid(alpha=0.3)
    ax = axes[3]
    sampled = sorted((r for r in rows if r["mode"] == "sampled"), key=lambda r: r["version"])
    for key in pass_keys:
        sel = [r for r in sampled if key in r]
        ax.errorbar(
            [r["version"] for r in sel],
            [r[key] for r in sel],
            yerr=[_finite(r.get(f"{key}_se")) for r in sel],
            marker="o",
            capsize=3,
            label=key.replace("pass_at_", "pass@"),
        )
    ax.set_title("pass@k (sampled)")
    ax.set_xlabel("policy version")
    ax.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int) -> Path:
    """Save a matplotlib figure as a PNG atomically (a temporary file in the same folder, then a rename: a reader
    of the report never sees half a picture) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(temp, dpi=dpi)
        os.replace(temp, path)
    finally:
        plt.close(fig)
        temp.unlink(missing_ok=True)
    return path


def _finite(value: float | None) -> float:
    return 0.0 if value is None or math.isnan(value) else float(value)
