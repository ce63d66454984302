"""GRPO objective: every output field and its gradients against TorchRL 0.14.1 and a hand-written reference."""

from __future__ import annotations

import math

import pytest
import torch

from llmrl_core.objectives import GRPOLoss, GRPOLossOutput, grpo_loss

B, T, V = 3, 6, 5


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Several agents share this 2-core machine; with 2 OpenMP threads under oversubscription a SmolLM2 forward
    pass took 3-4 s for 40 tokens, 0.2 s with 1 thread. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fixed_inputs():
    """Deterministic inputs, identical to the script that produced the TorchRL numbers below."""
    k = torch.arange(B * T * V, dtype=torch.float64)
    logits = (1.5 * torch.sin(0.7 * k + 0.3)).reshape(B, T, V).float()
    tokens = torch.tensor([[(3 * i + 2 * t) % V for t in range(T)] for i in range(B)])
    lengths = [6, 4, 5]
    mask = torch.tensor([[t < lengths[i] for t in range(T)] for i in range(B)])
    j = torch.arange(B * T, dtype=torch.float64).reshape(B, T)
    cur = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    sampler = (cur + 0.3 * torch.cos(1.3 * j).float()).detach()
    sampler[1, 2] = float("nan")
    ref = (cur + 0.2 * torch.sin(2.1 * j).float()).detach()
    adv = torch.tensor([1.0, -0.5, 0.7])
    return logits, tokens, mask, sampler, ref, adv


def policy_terms(logits: torch.Tensor, tokens: torch.Tensor):
    """Per-token log-probs and entropies of a categorical policy over ``logits``."""
    log_probs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    return log_probs, entropy


def ours(**options):
    logits, tokens, mask, sampler, ref, adv = fixed_inputs()
    logits = logits.clone().requires_grad_(True)
    log_probs, entropy = policy_terms(logits, tokens)
    out = grpo_loss(log_probs, sampler, adv, mask, entropy=entropy, ref_log_probs=ref, **options)
    return out, logits


# ---------------------------------------------------------------------------------------------------------------
# Hand-written reference (float64, one token at a time)
# ---------------------------------------------------------------------------------------------------------------


def reference(
    logits,
    tokens,
    mask,
    sampler,
    ref,
    adv,
    *,
    eps=(0.2, 0.2),
    aggregation="token_mean",
    norm_constant=None,
    cispo=False,
    entropy_coeff=None,
    kl_ref_coeff=None,
    kl_inf_coeff=None,
    estimator="k3",
    kl_mask_threshold=None,
    tis_cap=None,
):
    """Returns a dict of scalars (loss terms as float64 tensors with grad to ``logits``)."""
    logp_all = torch.log_softmax(logits.double(), -1)
    probs_all = logp_all.exp()

    def kl(cur, other):
        d = other - cur
        return {"k1": -d, "k2": 0.5 * d * d, "k3": torch.exp(d) - 1 - d}[estimator]

    rows: list[list[dict]] = []
    for b in range(B):
        row = []
        for t in range(T):
            s = float(sampler[b, t])
            if not bool(mask[b, t]) or not math.isfinite(s):
                continue
            cur = logp_all[b, t, int(tokens[b, t])]
            old = cur.detach() if tis_cap is not None else None
            base = old if tis_cap is not None else torch.tensor(s, dtype=torch.float64)
            if kl_mask_threshold is not None and 0.5 * (float(cur.detach()) - s) ** 2 > kl_mask_threshold:
                continue
            ratio = torch.exp(cur - base)
            low, high = 1 - eps[0], 1 + eps[1]
            clipped_ratio = torch.clamp(ratio, low, high)
            is_clipped = float(ratio.detach()) < low or float(ratio.detach()) > high
            a = float(adv[b])
            if cispo:
                term = -clipped_ratio.detach() * a * cur
                value_shift = -float(clipped_ratio.detach()) * a - float(term.detach())  # value = -clip(w) * A
            else:
                term = -torch.minimum(ratio * a, clipped_ratio * a)
                value_shift = 0.0
            if tis_cap is not None:
                term = term * min(math.exp(float(old) - s), tis_cap)
            ent = -(probs_all[b, t] * logp_all[b, t]).sum()
            row.append(
                {
                    "obj": term,
                    "obj_shift": value_shift,
                    "clipped": is_clipped,
                    "lw": float(cur.detach()) - float(base),
                    "kl_approx": s - float(cur.detach()),
                    "ent": ent,
                    "kl_ref": kl(cur, float(ref[b, t])),
                    "kl_inf": kl(cur, s),
                }
            )
        rows.append(row)
    tokens_all = [tok for row in rows for tok in row]
    n = len(tokens_all)

    def agg(key):
        if aggregation == "token_mean":
            return sum(tok[key] for tok in tokens_all) / n
        if aggregation == "prompt_mean":
            means = [sum(tok[key] for tok in row) / len(row) for row in rows if row]
            return sum(means) / len(means)
        if aggregation == "sequence_sum":
            return sum(tok[key] for tok in tokens_all) / (B * norm_constant)
        raise AssertionError(aggregation)

    out = {"loss_objective": agg("obj")}
    out["loss_objective_value"] = float(out["loss_objective"].detach()) + float(agg("obj_shift"))
    out["clip_fraction"] = sum(tok["clipped"] for tok in tokens_all) / n
    out["kl_approx"] = sum(tok["kl_approx"] for tok in tokens_all) / n
    lws = [tok["lw"] for tok in tokens_all]
    out["ESS"] = sum(math.exp(x) for x in lws) ** 2 / sum(math.exp(2 * x) for x in lws) / n
    out["entropy"] = float(sum(tok["ent"] for tok in tokens_all).detach()) / n
    if entropy_coeff is not None:
        for tok in tokens_all:
            tok["neg_ent"] = -entropy_coeff * tok["ent"]
        out["loss_entropy"] = agg("neg_ent")
    if kl_ref_coeff is not None:
        out["kl_to_ref"] = float(sum(tok["kl_ref"] for tok in tokens_all).detach()) / n
        out["loss_kl_to_ref"] = kl_ref_coeff * agg("kl_ref")
    if kl_inf_coeff is not None:
        out["kl_to_inference"] = float(sum(tok["kl_inf"] for tok in tokens_all).detach()) / n
        out["loss_kl_to_inference"] = kl_inf_coeff * agg("kl_inf")
    out["n"] = n
    return out


def val(x) -> float:
    """A Python float from a float or a (possibly grad-carrying) scalar tensor."""
    return float(torch.as_tensor(x).detach())


def grad_of(loss, logits):
    (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
    return g


def ref_grad(loss, logits64):
    (g,) = torch.autograd.grad(loss, logits64, retain_graph=True)
    return g.float()


def run_reference(**kwargs):
    logits, tokens, mask, sampler, ref, adv = fixed_inputs()
    logits64 = logits.double().requires_grad_(True)
    return reference(logits64, tokens, mask, sampler, ref, adv, **kwargs), logits64


# ---------------------------------------------------------------------------------------------------------------
# TorchRL 0.14.1
# ---------------------------------------------------------------------------------------------------------------

# expected values from TorchRL 0.14.1 (torchrl.objectives.llm.GRPOLoss / CISPOLoss run on fixed_inputs() in a
# separate venv; the actor is a stub whose get_dist returns LLMMaskedCategorical(logits, mask)).
TORCHRL_DEFAULT = {  # clip_epsilon=0.2, token_mean, entropy bonus 0.01, kl_to_ref_coeff=0.1, kl_to_inference=0.05
    "loss_objective": -0.544108510017395,
    "clip_fraction": 0.4444444477558136,  # over all 18 (B*T) positions
    "kl_approx": 0.012353996746242046,  # over all 18 positions
    "ESS": 0.954531192779541,
    "entropy": 1.0952720642089844,  # over all 18 positions, padding counted at log(V)
    "loss_entropy": -0.01303479541093111,
    "kl_to_ref": 0.006647524889558554,  # over all 18 positions
    "loss_kl_to_ref": 0.0006647525005973876,
    "kl_to_inference": 0.01859307661652565,  # over all 18 positions
    "loss_kl_to_inference": 0.0009296538191847503,
}
TORCHRL_DEFAULT_GRAD = [  # d loss_objective / d logits, flattened (B, T, V)
    -0.046734288, 0.01401958, 0.017562144, 0.010929257, 0.004223311, 0.008597486, 0.004967723, -0.060199831,
    0.012285771, 0.034348853, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.031449314, 0.018985033,
    0.00724393, -0.059314061, 0.001635783, -0.051918756, 0.003009417, 0.008418567, 0.018484514, 0.022006264,
    -0.020459751, -0.007760515, -0.002962052, 0.033351313, -0.002168997, 0.04521415, -0.006278948, -0.01363223,
    -0.015954806, -0.009348172, 0.0, 0.0, 0.0, 0.0, 0.0, -0.003881608, -0.008331179, -0.00958513, -0.005534117,
    0.027332038, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.029351311,
    0.016463114, 0.006115169, -0.053469229, 0.001539637, -0.03833143, 0.002415849, 0.006733349, 0.013944831,
    0.015237404, 0.022676978, 0.008385147, -0.036070514, 0.002160186, 0.002848205, 0.002953112, 0.008217583,
    0.016810268, 0.018054405, -0.046035368, 0.0, 0.0, 0.0, 0.0, 0.0,
]  # fmt: skip
TORCHRL_ASYM_PROMPT_MEAN = {"loss_objective": -0.38562893867492676, "clip_fraction": 0.3888888955116272}
TORCHRL_ASYM_PROMPT_MEAN_GRAD = [
    -0.036348891, 0.010904117, 0.013659446, 0.008500533, 0.003284798, 0.006686933, 0.003863784, -0.046822086,
    0.0095556, 0.026715774, 0.0, 0.0, 0.0, 0.0, 0.0, 0.002499352, -0.06614513, 0.006360403, 0.017790196,
    0.039495178, 0.024460576, 0.014766137, 0.005634168, -0.046133157, 0.001272276, -0.040381253, 0.002340657,
    0.006547773, 0.014376844, 0.017115982, -0.031826276, -0.012071911, -0.004607636, 0.051879819, -0.003373996,
    0.070333123, -0.009767253, -0.02120569, -0.024818584, -0.014541601, 0.0, 0.0, 0.0, 0.0, 0.0, -0.006038058,
    -0.012959611, -0.014910202, -0.008608626, 0.0425165, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.027394556, 0.015365572, 0.005707491, -0.049904611, 0.001436995, -0.035776, 0.002254793,
    0.006284458, 0.013015174, 0.014221576, 0.021165179, 0.007826136, -0.033665814, 0.002016174, 0.002658325,
    0.002756238, 0.007669745, 0.015689583, 0.016850779, -0.042966343, 0.0, 0.0, 0.0, 0.0, 0.0,
]  # fmt: skip
TORCHRL_CISPO = {"loss_objective": -0.5679876208305359, "clip_fraction": 0.3888888955116272}
TORCHRL_CISPO_GRAD = [
    0.0, 0.0, 0.0, 0.0, 0.0, 0.008597486, 0.004967723, -0.060199831, 0.012285771, 0.034348853, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.003213453, -0.085043743, 0.008177662, 0.022873111, 0.050779518, 0.031449314, 0.018985033, 0.00724393,
    -0.059314061, 0.001635783, 0.0, 0.0, 0.0, 0.0, 0.0, -0.020459751, -0.007760515, -0.002962052, 0.033351313,
    -0.002168997, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.003881608, -0.008331179, -0.00958513,
    -0.005534117, 0.027332038, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.029351311, 0.016463114, 0.006115169, -0.053469229, 0.001539637, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.002953112, 0.008217583, 0.016810268, 0.018054405, -0.046035368, 0.0, 0.0, 0.0, 0.0, 0.0,
]  # fmt: skip
TORCHRL_KL_MASK = {"loss_objective": -0.40875232219696045, "ESS": 0.9865091443061829}  # kl_mask_threshold=0.02
TORCHRL_KL_MASK_GRAD = [
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0200608, 0.011591353, -0.140466273, 0.0286668, 0.080147326, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.0, 0.073381729, 0.044298414, 0.016902504, -0.138399482, 0.003816828, 0.0, 0.0, 0.0, 0.0,
    0.0, -0.047739416, -0.018107867, -0.006911454, 0.077819735, -0.005060994, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, -0.009057086, -0.019439416, -0.022365304, -0.012912938, 0.06377475, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.068486385, 0.038413931, 0.014268727, -0.124761537,
    0.003592486, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.006890595, 0.01917436, 0.039223958,
    0.042126946, -0.107415862, 0.0, 0.0, 0.0, 0.0, 0.0,
]  # fmt: skip
TORCHRL_NONE = [  # aggregation="none": per-token loss_objective, flattened (B, T), masked positions 0
    -0.7408182621002197, -0.9228860139846802, -1.2000000476837158, -1.2000000476837158, -0.8688759803771973,
    -0.7460397481918335, 0.49197179079055786, 0.6644267439842224, 0.0, 0.4117140769958496, 0.0, 0.0,
    -0.8400000333786011, -0.782122015953064, -0.5512424111366272, -0.5513312220573425, -0.782315731048584, 0.0,
]  # fmt: skip

N_ALL = B * T  # TorchRL's denominator for its padding-averaged fields
N_TRAINED = 14  # 6 + 4 + 5 valid tokens, minus the NaN sampler log-prob at (1, 2)


def grad_tensor(values):
    return torch.tensor(values).reshape(B, T, V)


def test_default_matches_torchrl_and_reference():
    out, logits = ours(clip_epsilon=0.2, entropy_coeff=0.01, kl_to_ref_coeff=0.1, kl_to_inference_coeff=0.05)
    assert isinstance(out, GRPOLossOutput)
    assert int(out.num_tokens) == N_TRAINED
    tr = TORCHRL_DEFAULT
    # Same definition as TorchRL: loss terms and ESS.
    for key in ("loss_objective", "ESS", "loss_entropy"):
        assert val(getattr(out, key)) == pytest.approx(tr[key], abs=2e-6), key
    # TorchRL divides these by B*T (padding counted as 0); ours by the trained tokens.
    for key in ("clip_fraction", "kl_approx", "kl_to_ref", "kl_to_inference", "loss_kl_to_ref", "loss_kl_to_inference"):
        assert val(getattr(out, key)) == pytest.approx(tr[key] * N_ALL / N_TRAINED, abs=2e-6), key
    # TorchRL's entropy also averages over all B*T positions, padding counting as 0 (its masked distribution
    # fills padding logits with finfo.min, which gives entropy 0); the NaN-sampler token at (1, 2) is a valid
    # position for TorchRL's distribution mask, so it is in TorchRL's sum but not in ours.
    logits_plain, tokens, mask, *_ = fixed_inputs()
    _, ent = policy_terms(logits_plain, tokens)
    assert tr["entropy"] == pytest.approx(float(ent[mask].sum()) / N_ALL, abs=2e-6)
    trained = mask.clone()
    trained[1, 2] = False
    assert float(out.entropy) == pytest.approx(float(ent[trained].mean()), abs=2e-6)
    # Gradients of the objective: TorchRL's numbers.
    torch.testing.assert_close(
        grad_of(out.loss_objective, logits), grad_tensor(TORCHRL_DEFAULT_GRAD), atol=2e-6, rtol=0
    )
    # Every field and gradient against the hand-written reference.
    exp, logits64 = run_reference(entropy_coeff=0.01, kl_ref_coeff=0.1, kl_inf_coeff=0.05)
    for key in ("clip_fraction", "kl_approx", "ESS", "entropy", "kl_to_ref", "kl_to_inference"):
        assert val(getattr(out, key)) == pytest.approx(val(exp[key]), abs=2e-6), key
    for key in ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference"):
        assert val(getattr(out, key)) == pytest.approx(val(exp[key]), abs=2e-6), key
        torch.testing.assert_close(
            grad_of(getattr(out, key), logits), ref_grad(exp[key], logits64), atol=2e-6, rtol=0, msg=key
        )
    total = exp["loss_objective"] + exp["loss_entropy"] + exp["loss_kl_to_ref"] + exp["loss_kl_to_inference"]
    assert float(out.loss.detach()) == pytest.approx(float(total.detach()), abs=2e-6)
    torch.testing.assert_close(grad_of(out.loss, logits), ref_grad(total, logits64), atol=2e-6, rtol=0)


def test_asymmetric_clip_prompt_mean_matches_torchrl():
    out, logits = ours(clip_epsilon=(0.2, 0.28), aggregation="prompt_mean")
    assert float(out.loss_objective.detach()) == pytest.approx(TORCHRL_ASYM_PROMPT_MEAN["loss_objective"], abs=2e-6)
    assert float(out.clip_fraction) == pytest.approx(
        TORCHRL_ASYM_PROMPT_MEAN["clip_fraction"] * N_ALL / N_TRAINED, abs=2e-6
    )
    torch.testing.assert_close(
        grad_of(out.loss_objective, logits), grad_tensor(TORCHRL_ASYM_PROMPT_MEAN_GRAD), atol=2e-6, rtol=0
    )
    exp, logits64 = run_reference(eps=(0.2, 0.28), aggregation="prompt_mean")
    torch.testing.assert_close(
        grad_of(out.loss_objective, logits), ref_grad(exp["loss_objective"], logits64), atol=2e-6, rtol=0
    )


def test_cispo_value_matches_torchrl_gradient_keeps_clipped_tokens():
    out, logits = ours(clip_epsilon=(0.2, 0.28), objective="cispo")
    assert float(out.loss_objective.detach()) == pytest.approx(TORCHRL_CISPO["loss_objective"], abs=2e-6)
    grad = grad_of(out.loss_objective, logits)
    torchrl_grad = grad_tensor(TORCHRL_CISPO_GRAD)
    # Unclipped tokens: same gradient as TorchRL. Clipped tokens: TorchRL's clamp zeroes them, CISPO keeps
    # sg(clip(w)) * A * grad(log pi) -- checked against the hand-written reference.
    unclipped = torchrl_grad.abs().sum(-1) > 0
    torch.testing.assert_close(grad[unclipped], torchrl_grad[unclipped], atol=2e-6, rtol=0)
    exp, logits64 = run_reference(eps=(0.2, 0.28), cispo=True)
    assert float(out.loss_objective.detach()) == pytest.approx(exp["loss_objective_value"], abs=2e-6)
    torch.testing.assert_close(grad, ref_grad(exp["loss_objective"], logits64), atol=2e-6, rtol=0)
    _, _, mask, *_ = fixed_inputs()
    clipped_trained = mask & ~unclipped
    clipped_trained[1, 2] = False
    assert clipped_trained.any() and (grad[clipped_trained].abs().sum(-1) > 1e-4).all()


def test_kl_mask_threshold_matches_torchrl():
    out, logits = ours(clip_epsilon=0.2, kl_mask_threshold=0.02)
    assert float(out.loss_objective.detach()) == pytest.approx(TORCHRL_KL_MASK["loss_objective"], abs=2e-6)
    assert float(out.ESS) == pytest.approx(TORCHRL_KL_MASK["ESS"], abs=2e-6)
    torch.testing.assert_close(
        grad_of(out.loss_objective, logits), grad_tensor(TORCHRL_KL_MASK_GRAD), atol=2e-6, rtol=0
    )
    exp, logits64 = run_reference(kl_mask_threshold=0.02)
    assert int(out.num_tokens) == exp["n"] < N_TRAINED
    for key in ("clip_fraction", "kl_approx", "ESS"):
        assert val(getattr(out, key)) == pytest.approx(val(exp[key]), abs=2e-6), key


def test_aggregation_none_matches_torchrl():
    out, _ = ours(clip_epsilon=0.2, aggregation="none")
    assert out.loss_objective.shape == (B, T)
    torch.testing.assert_close(out.loss_objective.detach(), torch.tensor(TORCHRL_NONE).reshape(B, T), atol=2e-6, rtol=0)


@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "sequence_sum"])
def test_aggregation_modes_against_reference(aggregation):
    norm = 8.0 if aggregation == "sequence_sum" else None
    out, logits = ours(aggregation=aggregation, norm_constant=norm, entropy_coeff=0.02, kl_to_ref_coeff=0.3)
    exp, logits64 = run_reference(aggregation=aggregation, norm_constant=norm, entropy_coeff=0.02, kl_ref_coeff=0.3)
    for key in ("loss_objective", "loss_entropy", "loss_kl_to_ref"):
        assert val(getattr(out, key)) == pytest.approx(val(exp[key]), abs=2e-6), key
        torch.testing.assert_close(grad_of(getattr(out, key), logits), ref_grad(exp[key], logits64), atol=2e-6, rtol=0)


def test_sequence_sum_is_length_unbiased_constant_normaliser():
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    log_probs, _ = policy_terms(logits, tokens)
    per_token = grpo_loss(log_probs, sampler, adv, mask, aggregation="none").loss_objective
    got = grpo_loss(log_probs, sampler, adv, mask, aggregation="sequence_sum", norm_constant=10.0).loss_objective
    assert float(got) == pytest.approx(float(per_token.sum()) / (B * 10.0), abs=1e-6)
    with pytest.raises(ValueError, match="norm_constant"):
        grpo_loss(log_probs, sampler, adv, mask, aggregation="sequence_sum")


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_against_reference(estimator):
    out, logits = ours(kl_to_ref_coeff=0.5, kl_to_inference_coeff=0.25, kl_estimator=estimator)
    exp, logits64 = run_reference(kl_ref_coeff=0.5, kl_inf_coeff=0.25, estimator=estimator)
    for key in ("kl_to_ref", "kl_to_inference", "loss_kl_to_ref", "loss_kl_to_inference"):
        assert val(getattr(out, key)) == pytest.approx(val(exp[key]), abs=2e-6), key
    for key in ("loss_kl_to_ref", "loss_kl_to_inference"):
        torch.testing.assert_close(grad_of(getattr(out, key), logits), ref_grad(exp[key], logits64), atol=2e-6, rtol=0)


def test_nan_sampler_log_prob_is_excluded():
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    logits = logits.requires_grad_(True)
    log_probs, _ = policy_terms(logits, tokens)
    out = grpo_loss(log_probs, sampler, adv, mask, kl_to_inference_coeff=0.1)
    assert all(math.isfinite(v) for v in out.metrics().values())
    grad = grad_of(out.loss, logits)
    assert torch.isfinite(grad).all()
    assert float(grad[1, 2].abs().sum()) == 0.0
    # Same result as masking that token out explicitly (with any finite sampler value there).
    mask2 = mask.clone()
    mask2[1, 2] = False
    sampler2 = sampler.clone()
    sampler2[1, 2] = 123.0
    out2 = grpo_loss(log_probs, sampler2, adv, mask2, kl_to_inference_coeff=0.1)
    for key, value in out.metrics().items():
        assert value == pytest.approx(out2.metrics()[key], abs=1e-7), key


def test_fully_masked_row_contributes_nothing():
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    logits = logits.requires_grad_(True)
    log_probs, entropy = policy_terms(logits, tokens)
    mask = mask.clone()
    mask[2] = False
    sampler = sampler.clone()
    sampler[2] = float("nan")  # garbage under a masked row must not leak
    for aggregation in ("token_mean", "prompt_mean"):
        out = grpo_loss(log_probs, sampler, adv, mask, aggregation=aggregation, entropy=entropy)
        grad = grad_of(out.loss, logits)
        assert torch.isfinite(grad).all() and float(grad[2].abs().sum()) == 0.0
        two = grpo_loss(log_probs[:2], sampler[:2], adv[:2], mask[:2], aggregation=aggregation, entropy=entropy[:2])
        for key, value in two.metrics().items():
            assert out.metrics()[key] == pytest.approx(value, abs=1e-7), (aggregation, key)


def test_everything_masked_gives_finite_zero_loss():
    logits, tokens, mask, sampler, ref, adv = fixed_inputs()
    logits = logits.requires_grad_(True)
    log_probs, entropy = policy_terms(logits, tokens)
    none = torch.zeros_like(mask)
    out = grpo_loss(log_probs, sampler, adv, none, entropy=entropy, ref_log_probs=ref, kl_to_ref_coeff=0.1)
    assert float(out.loss.detach()) == 0.0 and int(out.num_tokens) == 0
    assert all(math.isfinite(v) for v in out.metrics().values())
    assert float(grad_of(out.loss, logits).abs().sum()) == 0.0


def test_truncated_importance_sampling():
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    logits = logits.requires_grad_(True)
    log_probs, _ = policy_terms(logits, tokens)
    cap = 1.1
    out = grpo_loss(log_probs, sampler, adv, mask, tis_cap=cap)
    exp, logits64 = run_reference(tis_cap=cap)
    assert float(out.loss_objective.detach()) == pytest.approx(float(exp["loss_objective"].detach()), abs=2e-6)
    torch.testing.assert_close(
        grad_of(out.loss_objective, logits), ref_grad(exp["loss_objective"], logits64), atol=2e-6, rtol=0
    )
    # On-policy (old = current) the PPO ratio is 1: nothing is clipped, and the weights are the capped
    # trainer/sampler ratios.
    assert float(out.clip_fraction) == 0.0
    # With old_log_probs given explicitly equal to the current ones, the result is the same.
    same = grpo_loss(log_probs, sampler, adv, mask, tis_cap=cap, old_log_probs=log_probs.detach())
    assert float(same.loss_objective.detach()) == pytest.approx(float(out.loss_objective.detach()), abs=1e-7)
    # mask mode drops the tokens whose ratio exceeds the cap.
    ratio = (log_probs.detach() - sampler).exp()
    kept = mask & torch.isfinite(sampler) & (ratio <= cap)
    masked = grpo_loss(log_probs, sampler, adv, mask, tis_cap=cap, tis_mode="mask")
    assert int(masked.num_tokens) == int(kept.sum()) < N_TRAINED
    with pytest.raises(ValueError, match="tis_cap"):
        grpo_loss(log_probs, sampler, adv, mask, old_log_probs=log_probs.detach())


def test_bad_inputs_name_the_field():
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    log_probs, _ = policy_terms(logits, tokens)
    with pytest.raises(ValueError, match="sampler_log_probs"):
        grpo_loss(log_probs, sampler[:, :3], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(log_probs, sampler, torch.zeros(5), mask)
    with pytest.raises(TypeError, match="mask"):
        grpo_loss(log_probs, sampler, adv, mask.float())
    with pytest.raises(ValueError, match="clip_epsilon"):
        grpo_loss(log_probs, sampler, adv, mask, clip_epsilon=(0.2, 0.3, 0.4))
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(log_probs, sampler, adv, mask, aggregation="mean")
    with pytest.raises(ValueError, match="ref_log_probs"):
        grpo_loss(log_probs, sampler, adv, mask, kl_to_ref_coeff=0.1)
    bad_ref = log_probs.detach().clone()
    bad_ref[0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        grpo_loss(log_probs, sampler, adv, mask, kl_to_ref_coeff=0.1, ref_log_probs=bad_ref)
    with pytest.raises(TypeError, match="unknown"):
        GRPOLoss(None, clip_epsilonn=0.2)


def test_grpo_loss_module_scores_the_model(hf_model_fp32):
    """GRPOLoss on a packed batch equals grpo_loss on log-probs scored one sample at a time (no training)."""
    from llmrl_core.modules.backends.transformers.scoring import score_response_tokens
    from llmrl_core.trainer import TrainSample, pack_samples

    model, tok = hf_model_fp32
    texts = [("Hello there.", " General Kenobi!"), ("2 + 2 =", " 4, of course."), ("The sky is", " blue")]
    samples = []
    for i, (p, r) in enumerate(texts):
        pid, rid = tok(p)["input_ids"], tok(r, add_special_tokens=False)["input_ids"]
        sampler = (score_response_tokens(model, pid, rid) + 0.05 * torch.cos(torch.arange(len(rid)) * 1.0)).tolist()
        samples.append(TrainSample(pid, rid, sampler_logprobs=sampler, advantage=[1.0, -1.0, 0.5][i]))
    batch = pack_samples(samples)
    loss = GRPOLoss(model, clip_epsilon=0.02, kl_to_inference_coeff=0.1)
    with torch.no_grad():
        out = loss(batch)
        width = batch.mask.shape[1]
        rows = []
        for s in samples:
            lp = score_response_tokens(model, s.prompt_ids, s.response_ids)
            rows.append(torch.nn.functional.pad(lp, (0, width - len(lp))))
        expected = grpo_loss(
            torch.stack(rows), batch.sampler_log_probs, batch.advantages, batch.mask,
            clip_epsilon=0.02, kl_to_inference_coeff=0.1,
        )  # fmt: skip
    for key, value in expected.metrics().items():
        assert out.metrics()[key] == pytest.approx(value, abs=5e-5), key
    assert out.entropy is not None and float(out.entropy) > 0


def test_nan_under_padding_never_reaches_values_or_gradients():
    logits, tokens, mask, sampler, ref, adv = fixed_inputs()
    logits = logits.requires_grad_(True)
    log_probs, entropy = policy_terms(logits, tokens)
    per_token_adv = adv[:, None].expand(B, T).clone()
    per_token_adv[~mask] = float("nan")
    ref = ref.clone()
    ref[~mask] = float("nan")
    out = grpo_loss(
        log_probs, sampler, per_token_adv, mask, entropy=entropy, ref_log_probs=ref, kl_to_ref_coeff=0.1,
        kl_to_inference_coeff=0.1,
    )  # fmt: skip
    assert all(math.isfinite(v) for v in out.metrics().values())
    assert torch.isfinite(grad_of(out.loss, logits)).all()


# ---------------------------------------------------------------------------------------------------------------
# GSPO sequence-level importance ratio, sequence-level TIS, sampler-agreement diagnostics (hand-computed, float64)
# ---------------------------------------------------------------------------------------------------------------

NAN = float("nan")
TRAINED_2x3 = torch.tensor([[True, True, True], [True, True, False]])


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("adv0", [1.0, -1.0])
def test_gspo_sequence_ratio_golden_by_hand(adv0):
    lp_values = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
    sp_values = [[-1.1, -0.45, -2.05], [-0.32, -1.19, NAN]]  # (1, 2) is padding
    adv1 = -0.5
    eps = 0.02  # ratio bounds 0.98 and 1.02
    # Sequence log-ratios: the mean of (log_probs - sampler) over each row's trained tokens.
    s0 = ((-1.0 - -1.1) + (-0.5 - -0.45) + (-2.0 - -2.05)) / 3  # 0.1 / 3 = 0.0333 > log(1.02) = 0.0198: clipped
    s1 = ((-0.3 - -0.32) + (-1.2 - -1.19)) / 2  # 0.01 / 2 = 0.005: inside the bounds
    w0, w1 = math.exp(s0), math.exp(s1)
    assert w0 > 1.02 and 0.98 < w1 < 1.02
    # Row 1 (A < 0, unclipped): per-token term -w1 * A1, d/dlp_t = -w1 * A1 * (1/2) per token, two such tokens.
    term1 = -w1 * adv1
    if adv0 > 0:  # -min(w0 * A, 1.02 * A) = -1.02 * A: the clipped branch, no gradient
        term0, dterm0_ds0 = -1.02 * adv0, 0.0
    else:  # A < 0: w0 * A < 1.02 * A, the unclipped branch is the min, the gradient flows
        term0, dterm0_ds0 = -w0 * adv0, -w0 * adv0

    # token_mean over the 5 trained tokens: every token of a row carries its row's term.
    expected_loss = (3 * term0 + 2 * term1) / 5
    # d loss / d lp[0, t] = (3 tokens) * dterm0/ds0 * (1/3) / 5;  d loss / d lp[1, t] = 2 * term1 * (1/2) / 5.
    expected_grad = [[dterm0_ds0 / 5] * 3, [term1 / 5, term1 / 5, 0.0]]
    lp = leaf(lp_values)
    sampler = torch.tensor(sp_values, dtype=torch.float64)
    adv = torch.tensor([adv0, adv1], dtype=torch.float64)
    out = grpo_loss(lp, sampler, adv, TRAINED_2x3, clip_epsilon=eps, importance_level="sequence")
    assert abs(val(out.loss_objective) - expected_loss) < 1e-12
    (grad,) = torch.autograd.grad(out.loss_objective, lp)
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=0)
    # Diagnostics on the weights actually applied: 3 of 5 trained tokens lie in the clipped sequence; ESS over
    # the trained tokens, each carrying its row's sequence weight.
    assert abs(float(out.clip_fraction) - 3 / 5) < 1e-12
    expected_ess = (3 * w0 + 2 * w1) ** 2 / (3 * w0**2 + 2 * w1**2) / 5
    assert abs(float(out.ESS) - expected_ess) < 1e-12

    # prompt_mean is GSPO's own objective, the mean over sequences of the sequence-level surrogate.
    lp = leaf(lp_values)
    out = grpo_loss(lp, sampler, adv, TRAINED_2x3, clip_epsilon=eps, importance_level="sequence",
                    aggregation="prompt_mean")  # fmt: skip
    assert abs(val(out.loss_objective) - (term0 + term1) / 2) < 1e-12
    (grad,) = torch.autograd.grad(out.loss_objective, lp)
    # d/dlp[0, t] = dterm0/ds0 * (1/3) / 2;  d/dlp[1, t] = term1 * (1/2) / 2.
    expected_grad = [[dterm0_ds0 / 6] * 3, [term1 / 4, term1 / 4, 0.0]]
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=0)


def test_gspo_gradient_goes_through_the_sequence_mean_with_per_token_advantages():
    """With per-token advantages the sequence ratio (grad 1/|y| through s_i) and GSPO-token differ: check ours."""
    lp_values = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
    sp_values = [[-1.1, -0.45, -2.05], [-0.32, -1.19, NAN]]
    adv_values = [[1.0, 1.0, 1.0], [-0.5, -1.5, NAN]]  # NaN under padding must not leak
    s0 = ((-1.0 - -1.1) + (-0.5 - -0.45) + (-2.0 - -2.05)) / 3  # clipped above, A > 0: constant -1.02 per token
    s1 = ((-0.3 - -0.32) + (-1.2 - -1.19)) / 2  # unclipped
    w1 = math.exp(s1)
    # Row 1 terms: -w1 * A_t = 0.5 w1 and 1.5 w1. d/dlp[1, t] of their sum = (0.5 w1 + 1.5 w1) * (1/2) = w1 for
    # both tokens (GSPO-token would give 0.5 w1 and 1.5 w1); token_mean divides by 5.
    expected_loss = (3 * -1.02 + 0.5 * w1 + 1.5 * w1) / 5
    expected_grad = [[0.0, 0.0, 0.0], [w1 / 5, w1 / 5, 0.0]]
    lp = leaf(lp_values)
    out = grpo_loss(lp, torch.tensor(sp_values, dtype=torch.float64), torch.tensor(adv_values, dtype=torch.float64),
                    TRAINED_2x3, clip_epsilon=0.02, importance_level="sequence")  # fmt: skip
    assert s0 > math.log(1.02)
    assert abs(val(out.loss_objective) - expected_loss) < 1e-12
    (grad,) = torch.autograd.grad(out.loss_objective, lp)
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "sequence_sum"])
@pytest.mark.parametrize("objective", ["ppo", "cispo"])
@pytest.mark.parametrize("with_tis", [False, True])
def test_sequence_level_equals_token_level_when_each_row_has_one_log_ratio(aggregation, objective, with_tis):
    logits, tokens, mask, sampler, _, adv = fixed_inputs()
    norm = 8.0 if aggregation == "sequence_sum" else None
    # Per-row log-ratios: 0.05 (inside), -0.3 (below 0.8, clipped) and 0.25 (above 1.2, clipped).
    shift = torch.tensor([0.05, -0.3, 0.25], dtype=torch.float64)[:, None]
    results = []
    for level in ("token", "sequence"):
        logits64 = logits.double().requires_grad_(True)
        lp, _ = policy_terms(logits64, tokens)
        base = lp.detach() - shift
        # Without TIS the ratio is against the sampler (= base); with TIS against old (= base), the sampler
        # sitting 0.01 below it. The NaN sampler entry at (1, 2) stays.
        extra = {"tis_cap": 2.0, "old_log_probs": base} if with_tis else {}
        smp = torch.where(torch.isnan(sampler), sampler.double(), base - (0.01 if with_tis else 0.0))
        out = grpo_loss(lp, smp, adv.double(), mask, clip_epsilon=0.2, objective=objective, aggregation=aggregation,
                        norm_constant=norm, importance_level=level, **extra)  # fmt: skip
        (grad,) = torch.autograd.grad(out.loss_objective, logits64)
        results.append((out, grad))
    (tok, tok_grad), (seq, seq_grad) = results
    assert 0.0 < float(tok.clip_fraction) < 1.0
    for key in ("loss_objective", "clip_fraction", "ESS", "kl_approx", "num_tokens"):
        assert abs(val(getattr(tok, key)) - val(getattr(seq, key))) < 1e-12, key
    torch.testing.assert_close(seq_grad, tok_grad, atol=1e-12, rtol=0)
    assert tok_grad.abs().sum() > 0


def tis_inputs():
    lp_values = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
    old_values = [[-1.05, -0.45, -2.0], [-0.3, -1.1, 0.0]]
    sp_values = [[-1.3, -0.6, -2.1], [-0.2, -1.0, NAN]]
    return lp_values, old_values, sp_values


def test_sequence_level_tis_truncate_by_hand():
    lp_values, old_values, sp_values = tis_inputs()
    adv, cap = [1.0, -0.5], 1.5
    # PPO ratios exp(lp - old) (all within [0.8, 1.2], so unclipped): row 0 [0.05, -0.05, 0], row 1 [0, -0.1].
    r = [[-1.0 - -1.05, -0.5 - -0.45, -2.0 - -2.0], [-0.3 - -0.3, -1.2 - -1.1]]
    # Sequence behaviour ratios exp(sum (old - sampler)): row 0 exp(0.25 + 0.15 + 0.1) = exp(0.5) = 1.6487 > 1.5,
    # row 1 exp(-0.1 - 0.1) = exp(-0.2) = 0.8187.
    seq0 = math.exp((-1.05 - -1.3) + (-0.45 - -0.6) + (-2.0 - -2.1))
    seq1 = math.exp((-0.3 - -0.2) + (-1.1 - -1.0))
    w0, w1 = min(seq0, cap), min(seq1, cap)
    assert w0 == cap and w1 < 1.0
    # Unclipped PPO term per token: -exp(r) * A * w; token_mean over 5 tokens; d/dlp = the same value.
    terms = [[-math.exp(x) * adv[0] * w0 for x in r[0]], [-math.exp(x) * adv[1] * w1 for x in r[1]]]
    expected_loss = (sum(terms[0]) + sum(terms[1])) / 5
    expected_grad = [[t / 5 for t in terms[0]], [t / 5 for t in terms[1]] + [0.0]]
    lp = leaf(lp_values)
    old = torch.tensor(old_values, dtype=torch.float64)
    sampler = torch.tensor(sp_values, dtype=torch.float64)
    adv_t = torch.tensor(adv, dtype=torch.float64)
    out = grpo_loss(lp, sampler, adv_t, TRAINED_2x3, old_log_probs=old, tis_cap=cap, tis_level="sequence")
    assert abs(val(out.loss_objective) - expected_loss) < 1e-12
    (grad,) = torch.autograd.grad(out.loss_objective, lp)
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=0)
    assert int(out.num_tokens) == 5 and float(out.clip_fraction) == 0.0
    # Token level differs here: no token's own ratio exceeds the cap (max exp(0.25) = 1.28), so row 0 is not capped.
    token = grpo_loss(lp, sampler, adv_t, TRAINED_2x3, old_log_probs=old, tis_cap=cap, tis_level="token")
    assert abs(val(token.loss_objective) - expected_loss) > 1e-3


def test_sequence_level_tis_mask_drops_whole_rows_by_hand():
    lp_values, old_values, sp_values = tis_inputs()
    adv, cap = [1.0, -0.5], 1.5
    # Row 0's sequence ratio exp(0.5) = 1.6487 > 1.5: the whole row is dropped; row 1 (exp(-0.2)) is kept with
    # weight 1 (mask mode does not weight). token_mean over row 1's 2 tokens of -exp(r) * A1, r = [0, -0.1].
    r1 = [-0.3 - -0.3, -1.2 - -1.1]
    terms = [-math.exp(x) * adv[1] for x in r1]
    expected_loss = sum(terms) / 2
    expected_grad = [[0.0, 0.0, 0.0], [terms[0] / 2, terms[1] / 2, 0.0]]
    lp = leaf(lp_values)
    out = grpo_loss(
        lp, torch.tensor(sp_values, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64), TRAINED_2x3,
        old_log_probs=torch.tensor(old_values, dtype=torch.float64), tis_cap=cap, tis_mode="mask",
        tis_level="sequence",
    )  # fmt: skip
    assert int(out.num_tokens) == 2
    assert abs(val(out.loss_objective) - expected_loss) < 1e-12
    (grad,) = torch.autograd.grad(out.loss_objective, lp)
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12, rtol=0)
    # Token-level masking keeps every token here (largest token ratio exp(0.25) = 1.28 <= 1.5).
    token = grpo_loss(
        lp, torch.tensor(sp_values, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64), TRAINED_2x3,
        old_log_probs=torch.tensor(old_values, dtype=torch.float64), tis_cap=cap, tis_mode="mask",
    )  # fmt: skip
    assert int(token.num_tokens) == 5


def test_sampler_agreement_diagnostics_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], dtype=torch.float64)
    sampler = torch.tensor([[-1.5, -1.8, NAN], [-0.2, -2.0, -1.1]], dtype=torch.float64)
    # Trained tokens with a finite sampler log-prob: (0,0), (0,1), (1,0), (1,1) (NaN at (0,2); (1,2) padding).
    d = [-1.0 - -1.5, -2.0 - -1.8, -0.2 - -0.2, -3.0 - -2.0]  # log_probs - sampler = [0.5, -0.2, 0, -1]
    abs_mean = (0.5 + 0.2 + 0.0 + 1.0) / 4
    abs_max = 1.0
    # k3 of kl_estimate(cur, sampler): x = sampler - cur = -d, k3 = exp(x) - 1 - x.
    kl = (
        (math.exp(-0.5) - 1 + 0.5) + (math.exp(0.2) - 1 - 0.2) + (math.exp(0.0) - 1 - 0.0) + (math.exp(1.0) - 1 - 1.0)
    ) / 4
    ess = (math.exp(0.5) + math.exp(-0.2) + 1.0 + math.exp(-1.0)) ** 2
    ess /= math.exp(1.0) + math.exp(-0.4) + 1.0 + math.exp(-2.0)
    ess /= 4
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)

    def check(out):
        assert abs(float(out.sampler_abs_diff_mean) - abs_mean) < 1e-12
        assert abs(float(out.sampler_abs_diff_max) - abs_max) < 1e-12
        assert abs(float(out.kl_to_sampler) - kl) < 1e-12
        assert abs(float(out.sampler_ess) - ess) < 1e-12
        for key in ("sampler_abs_diff_mean", "sampler_abs_diff_max", "kl_to_sampler", "sampler_ess"):
            assert key in out.metrics() and not getattr(out, key).requires_grad

    assert d == pytest.approx([0.5, -0.2, 0.0, -1.0], abs=1e-15)
    plain = grpo_loss(lp.clone().requires_grad_(True), sampler, adv, TRAINED_2x3)
    check(plain)
    # Computed before the kl_mask_threshold / TIS-mask filters, and against the sampler (not old_log_probs):
    # kl_mask_threshold=0.1 drops (0,0) (0.5 * 0.25) and (1,1) (0.5 * 1); the TIS mask (old = lp + 0.3 at (1,0),
    # ratio exp(0.3) > 1) drops (1,0). Only (0,1) is trained, the diagnostics do not change.
    old = lp.clone()
    old[1, 0] += 0.3
    filtered = grpo_loss(lp.clone().requires_grad_(True), sampler, adv, TRAINED_2x3, kl_mask_threshold=0.1,
                         tis_cap=1.0, tis_mode="mask", old_log_probs=old)  # fmt: skip
    assert int(filtered.num_tokens) == 1
    check(filtered)
    # No trained token: every diagnostic is 0.
    empty = grpo_loss(lp, sampler, adv, torch.zeros_like(TRAINED_2x3))
    for key in ("sampler_abs_diff_mean", "sampler_abs_diff_max", "kl_to_sampler", "sampler_ess"):
        assert float(getattr(empty, key)) == 0.0, key


def test_bad_level_options_name_the_option_and_values():
    lp = torch.zeros(2, 3, dtype=torch.float64)
    sampler = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"importance_level must be one of \('token', 'sequence'\), got 'seq'"):
        grpo_loss(lp, sampler, adv, TRAINED_2x3, importance_level="seq")
    with pytest.raises(ValueError, match=r"tis_level must be one of \('token', 'sequence'\), got 'row'"):
        grpo_loss(lp, sampler, adv, TRAINED_2x3, tis_cap=2.0, tis_level="row")
    # GRPOLoss validates at construction, before any model work.
    with pytest.raises(ValueError, match=r"importance_level must be one of \('token', 'sequence'\)"):
        GRPOLoss(None, importance_level="sentence")
    with pytest.raises(ValueError, match=r"tis_level must be one of \('token', 'sequence'\)"):
        GRPOLoss(None, tis_cap=2.0, tis_level="episode")
    with pytest.raises(ValueError, match="tis_mode must be one of"):
        GRPOLoss(None, tis_cap=2.0, tis_mode="clip")
    loss = GRPOLoss(None, importance_level="sequence", tis_level="sequence", tis_cap=2.0, clip_epsilon=(3e-4, 4e-4))
    assert loss.options["importance_level"] == "sequence"
