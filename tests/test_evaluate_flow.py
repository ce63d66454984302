"""The evaluate flow for real: the packaged model as version 0, a perturbed copy stored as version 1, one vLLM
engine (in a subprocess) for both; greedy answers checked against transformers' greedy decoding of the same
prompts, the report files, the MLflow metrics and artifacts, the Prefect artifacts, and the re-run reuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmrl_core.builtin_data import load_gsm8k
from llmrl_core.evaluation import gsm8k_prompt_ids, load_result
from storage.checkpoints import CheckpointStore
from storage.layout import RunLayout

ROOT = Path(__file__).resolve().parents[1]
RUN_ID = "eval-flow-test"
N_QUESTIONS = 3
MAX_NEW_TOKENS = 24

FLOW_SCRIPT = """
import asyncio, json, sys
from flows.evaluate import evaluate
from prefect.client.orchestration import get_client

kwargs = json.loads(sys.argv[1])
first = evaluate(**kwargs)
second = evaluate(**kwargs)  # same settings and weights: every version is reused, no sampling

async def artifact_keys():
    async with get_client() as client:
        return sorted({a.key for a in await client.read_artifacts() if a.key})

async def flow_runs():
    async with get_client() as client:
        return [{"name": r.name, "tags": sorted(r.tags)} for r in await client.read_flow_runs()]

print("RESULT " + json.dumps({"first": first, "second": second, "artifacts": asyncio.run(artifact_keys()),
                             "flow_runs": asyncio.run(flow_runs())}))
"""


def _perturbed_state(model, scale: float = 0.004) -> dict[str, torch.Tensor]:
    """The model's weights plus seeded noise; the tied output head stays tied to the perturbed embeddings."""
    generator = torch.Generator().manual_seed(1)
    state = {
        name: (t + torch.randn(t.shape, generator=generator) * scale) if t.is_floating_point() else t.clone()
        for name, t in model.state_dict().items()
        if name != "lm_head.weight"
    }
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _hf_greedy_texts(model, tokenizer, prompts: list[list[int]]) -> list[str]:
    texts = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2
            )
            texts.append(tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True))
    return texts


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory, hf_model_fp32):
    """Store version 1, run the flow twice in a fresh process (versions [1, 0]: the base must be reloaded)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    model, _ = hf_model_fp32
    perturbed = _perturbed_state(model)
    store = CheckpointStore(RunLayout(RUN_ID, runs_root=runs_dir).checkpoints_dir)
    store.save(perturbed, 1, parent_version=0, config={"test": "perturbed copy"})
    kwargs = {
        "run_id": RUN_ID,
        "versions": [1, 0],
        "runs_dir": str(runs_dir),
        "n_questions": N_QUESTIONS,
        "n_samples": 2,
        "k_values": [1, 2],
        "temperature": 0.7,
        "max_new_tokens": MAX_NEW_TOKENS,
        "dtype": "float32",
    }
    proc = subprocess.run(
        [sys.executable, "-c", FLOW_SCRIPT, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={
            **os.environ,
            "PREFECT_HOME": str(runs_dir / "prefect"),
            # a busy 2-core machine can take longer than the default 20 s to start the ephemeral API
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line.removeprefix("RESULT ")), perturbed, runs_dir


@pytest.mark.slow
def test_versions_are_scored_with_their_own_weights(flow_run, hf_model_fp32, default_model_path):
    out, perturbed, _ = flow_run
    first = out["first"]
    assert first["versions"] == [1, 0] and first["reused"] == []
    results = {int(v): load_result(p) for v, p in first["results"].items()}
    model, tokenizer = hf_model_fp32
    prompts = gsm8k_prompt_ids(tokenizer, load_gsm8k("test", limit=N_QUESTIONS))

    from llmrl_core.modules.backends.transformers.scoring import load_causal_lm

    copy, _ = load_causal_lm(default_model_path, dtype="float32")
    copy.load_state_dict(perturbed)
    expected = {0: _hf_greedy_texts(model, tokenizer, prompts), 1: _hf_greedy_texts(copy, tokenizer, prompts)}
    for version in (0, 1):
        greedy = results[version].modes["greedy"]
        got = [q.samples[0].text for q in greedy.questions]
        assert got == expected[version], f"version {version}: vLLM greedy differs from transformers greedy"
        assert results[version].settings["policy_version"] == version
    assert expected[0] != expected[1]  # the perturbation changed the answers, so the check above is not vacuous
    sampled = results[0].modes["sampled"]
    assert sampled.n_samples == 2 and all(len(q.samples) == 2 for q in sampled.questions)
    assert all(1 <= s.num_tokens <= MAX_NEW_TOKENS for q in sampled.questions for s in q.samples)
    assert (
        results[1].settings["weights_id"]
        == CheckpointStore(RunLayout(RUN_ID, runs_root=flow_run[2]).checkpoints_dir).manifest(1).sha256
    )


@pytest.mark.slow
def test_report_mlflow_and_prefect_artifacts(flow_run):
    out, _, _ = flow_run
    first, second = out["first"], out["second"]
    rows = first["rows"]
    assert [(r["version"], r["mode"]) for r in rows] == [(0, "greedy"), (0, "sampled"), (1, "greedy"), (1, "sampled")]
    for row in rows:
        for metric in ("accuracy", "tag_rate", "mean_reward"):
            assert 0.0 <= row[metric] <= 1.0 and f"{metric}_se" in row
        assert row["num_questions"] == N_QUESTIONS
    assert "pass_at_2" in rows[1] and "delta_accuracy" in rows[3]
    assert Path(first["report_png"]).read_bytes()[:4] == b"\x89PNG"
    assert "| version | mode |" in Path(first["report_markdown"]).read_text()
    assert sorted(second["reused"]) == [0, 1] and second["rows"] == rows

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=first["mlflow"]["tracking_uri"])
    run_id = first["mlflow"]["mlflow_run_id"]
    history = client.get_metric_history(run_id, "greedy/accuracy")
    assert sorted({m.step for m in history}) == [0, 1]
    assert {m.step: m.value for m in history}[1] == pytest.approx(rows[2]["accuracy"])
    assert client.get_run(run_id).data.tags["llmrl_evaluated_run_id"] == RUN_ID
    listed = {a.path for a in client.list_artifacts(run_id, "report")}
    assert {"report/curves.png", "report/report.md", "report/report.json", "report/side_by_side.json"} <= listed
    assert len(client.list_artifacts(run_id, "results")) == 2
    key = f"evaluate-{RUN_ID}"
    assert {f"{key}-table", f"{key}-curves", f"{key}-report", f"{key}-side-by-side"} <= set(out["artifacts"])
    # the versions' answers to the same questions, side by side: each row is a question, each version its greedy
    # answer as stored in that version's result
    questions = [" ".join(r["question"].split()) for r in load_gsm8k("test", limit=N_QUESTIONS)]
    answers = first["side_by_side"]
    assert len(answers) == N_QUESTIONS
    for row, question in zip(answers, questions, strict=True):  # the text, clipped to 200 characters
        shown = row["question"].removesuffix("…")
        assert shown and question.startswith(shown)
    for version in (0, 1):
        stored = load_result(first["results"][str(version)]).modes["greedy"].questions
        assert [row[f"v{version} tokens"] for row in answers] == [q.samples[0].num_tokens for q in stored]
        assert [row[f"v{version} answer"].split(" ", 1)[0] for row in answers] == [
            "✓" if q.samples[0].correct else "✗" for q in stored
        ]
    # the evaluation's flow runs are named and tagged like the run they evaluate, not at random (issue 71)
    assert out["flow_runs"] == [{"name": f"{RUN_ID} evaluate", "tags": ["evaluation", "llmrl", f"run:{RUN_ID}"]}] * 2


def test_version_selection_and_base_weights(tmp_path, default_model_path):
    from llmrl_core.model_store import base_state_dict
    from tasks.evaluate import artifact_key, resolve_versions

    assert resolve_versions.fn("r1", str(tmp_path), "all") == [0]  # nothing stored yet: the base model only
    store = CheckpointStore(RunLayout("r1", runs_root=tmp_path).checkpoints_dir)
    store.save({"w": torch.zeros(2)}, 2, parent_version=0)
    assert resolve_versions.fn("r1", str(tmp_path), "all") == [0, 2]
    assert resolve_versions.fn("r1", str(tmp_path), [2, 0, 2]) == [2, 0]
    with pytest.raises(ValueError, match=r"run 'r1' has no checkpoint for version\(s\) \[1\] \(stored: \[2\]\)"):
        resolve_versions.fn("r1", str(tmp_path), [1, 2])
    with pytest.raises(ValueError, match="list of ints or 'all'"):
        resolve_versions.fn("r1", str(tmp_path), "latest")
    state = base_state_dict(default_model_path)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]  # the tied head is sent explicitly
    assert artifact_key("Evaluate-Run_1.x") == "evaluate-run-1-x"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"agent": "my_agents:solve"}, "agent my_agents:solve"),
        ({"verifiers": "wordle"}, "verifiers environment wordle"),
    ],
)
def test_an_endpoint_run_is_refused_the_transformers_backend_before_any_engine(tmp_path, env, named):
    """Agents and verifiers environments talk to the engine's OpenAI endpoint, which only vLLM serves: evaluating
    such a run with backend=transformers is refused by name before anything starts."""
    from flows.evaluate import evaluate
    from llmrl_core.pipeline.preflight import PreflightError

    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": env}))
    with pytest.raises(PreflightError, match=rf"backend: run 'r1' trained the {named}, .* backend=vllm"):
        evaluate.fn("r1", runs_dir=str(tmp_path), backend="transformers")
    with pytest.raises(PreflightError, match="backend: must be vllm or transformers, got 'hf'"):
        evaluate.fn("r1", runs_dir=str(tmp_path), backend="hf")
