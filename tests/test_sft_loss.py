"""SFT / MinorSFT objective against TorchRL 0.14.1 and a hand-written reference (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from llmrl_core.objectives import SFTLoss, SFTLossOutput, sft_loss

LENGTHS = [7, 5, 6]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Several agents share this 2-core machine; with 2 OpenMP threads under oversubscription a SmolLM2 forward
    pass took 3-4 s for 40 tokens, 0.2 s with 1 thread. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fixed_inputs():
    """Ragged per-token log-probs, assistant masks (2 prompt tokens + one tool token) and reference log-probs;
    identical to the script that produced the TorchRL numbers."""
    lps, masks, refs = [], [], []
    for i, n in enumerate(LENGTHS):
        j = torch.arange(n, dtype=torch.float64)
        lps.append((-0.5 - 0.4 * torch.sin(1.1 * j + i) ** 2).float())
        m = torch.tensor([t >= 2 and t != 4 + i for t in range(n)])
        masks.append(m)
        refs.append(torch.where(m, lps[-1] + 0.15 * torch.cos(0.9 * j + 2 * i).float(), torch.zeros(n)))
    width = max(LENGTHS)

    def pad(xs, fill):
        return torch.stack([torch.nn.functional.pad(x, (0, width - len(x)), value=fill) for x in xs])

    return pad(lps, float("nan")), pad(masks, False), pad(refs, float("nan"))


def padded_grad(rows):
    width = max(LENGTHS)
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows])


# expected values from TorchRL 0.14.1 (torchrl.objectives.llm.sft.SFTLoss with a stub actor returning the
# log-probs above, assistant masks given as ("masks", "all_assistant_mask"), run in a separate venv).
TORCHRL_MEAN = 0.6846349239349365
TORCHRL_MEAN_GRAD = [
    [0.0, 0.0, -0.083333336, -0.083333336, 0.0, -0.083333336, -0.083333336],
    [0.0, 0.0, -0.111111112, -0.111111112, -0.111111112],
    [0.0, 0.0, -0.083333336, -0.083333336, -0.083333336, -0.083333336],
]
TORCHRL_SUM_UNNORMALISED = 7.523627281188965
TORCHRL_NONE = [0.6273395419120789, 0.6919910311698914, 0.7345741391181946]
TORCHRL_KL_TO_REF = 0.0028945240192115307  # over all 18 concatenated tokens (non-assistant count as 0)
TORCHRL_MINOR_SFT = 0.6953875422477722  # beta=0.5
TORCHRL_MINOR_SFT_GRAD = [
    [0.0, 0.0, -0.020695176, -0.020695176, 0.0, -0.020695176, -0.020695176],
    [0.0, 0.0, -0.027768129, -0.027768129, -0.027768129],
    [0.0, 0.0, -0.021116354, -0.021116354, -0.021116354, -0.021116354],
]
N_ALL, N_TRAINED = sum(LENGTHS), 11


def run(**options):
    lp, mask, ref = fixed_inputs()
    lp = lp.requires_grad_(True)
    return sft_loss(lp, mask, ref_log_probs=ref, **options), lp


def grad(loss, x):
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    return g


def hand_reference(beta=None, normalize=True):
    """Per-sequence loss with plain Python loops."""
    lp, mask, ref = fixed_inputs()
    out = []
    for b in range(len(LENGTHS)):
        idx = [t for t in range(LENGTHS[b]) if bool(mask[b, t])]
        s = sum(float(lp[b, t]) for t in idx) / (len(idx) if normalize else 1)
        if beta is None:
            out.append(-s)
        else:
            s_ref = sum(float(ref[b, t]) for t in idx) / (len(idx) if normalize else 1)
            out.append(math.log1p(math.exp(-beta * (s - s_ref))))
    return out


def test_sft_mean_matches_torchrl_and_reference():
    out, lp = run()
    assert isinstance(out, SFTLossOutput) and int(out.num_tokens) == N_TRAINED
    assert float(out.loss_sft.detach()) == pytest.approx(TORCHRL_MEAN, abs=1e-6)
    assert float(out.loss_sft.detach()) == pytest.approx(sum(hand_reference()) / 3, abs=1e-6)
    torch.testing.assert_close(grad(out.loss, lp), padded_grad(TORCHRL_MEAN_GRAD), atol=1e-7, rtol=0)
    assert out.loss_kl_to_ref is None and out.kl_to_ref is None


def test_sft_reductions_match_torchrl():
    out, lp = run(normalize_by_seq_length=False, reduction="sum")
    assert float(out.loss_sft.detach()) == pytest.approx(TORCHRL_SUM_UNNORMALISED, abs=1e-5)
    assert float(out.loss_sft.detach()) == pytest.approx(sum(hand_reference(normalize=False)), abs=1e-5)
    mask = fixed_inputs()[1]
    torch.testing.assert_close(grad(out.loss, lp), -mask.float())  # -1 on every assistant token, 0 elsewhere
    none, _ = run(reduction="none")
    torch.testing.assert_close(none.loss_sft.detach(), torch.tensor(TORCHRL_NONE), atol=1e-6, rtol=0)


def test_sft_kl_to_ref_masked_mean():
    out, lp = run(kl_to_ref_coeff=0.2)
    assert float(out.loss_sft.detach()) == pytest.approx(TORCHRL_MEAN, abs=1e-6)
    # TorchRL averages over all tokens of the sequences (non-assistant tokens count as 0); ours over the mask.
    assert float(out.kl_to_ref) == pytest.approx(TORCHRL_KL_TO_REF * N_ALL / N_TRAINED, abs=1e-7)
    lp_plain, mask, ref = fixed_inputs()
    d = ref[mask].double() - lp_plain[mask].double()
    assert float(out.kl_to_ref) == pytest.approx(float((d.exp() - 1 - d).mean()), abs=1e-7)
    # The loss term is reduced like loss_sft: mean over sequences of each sequence's mean k3 (TorchRL: coeff * kl).
    row_means, expected = [], torch.zeros_like(lp_plain)
    for b in range(len(LENGTHS)):
        db = ref[b][mask[b]].double() - lp_plain[b][mask[b]].double()
        row_means.append(float((db.exp() - 1 - db).mean()))
        expected[b][mask[b]] = (0.2 * (1 - db.exp()) / (len(db) * len(LENGTHS))).float()
    assert float(out.loss_kl_to_ref.detach()) == pytest.approx(0.2 * sum(row_means) / len(LENGTHS), abs=1e-7)
    # d/dlp of k3 = exp(ref - lp) - 1 - (ref - lp) is 1 - exp(ref - lp).
    torch.testing.assert_close(grad(out.loss_kl_to_ref, lp), expected, atol=1e-7, rtol=0)


def test_minor_sft_matches_torchrl_and_reference():
    out, lp = run(loss_function="minor_sft", beta=0.5)
    assert float(out.loss_sft.detach()) == pytest.approx(TORCHRL_MINOR_SFT, abs=1e-6)
    assert float(out.loss_sft.detach()) == pytest.approx(sum(hand_reference(beta=0.5)) / 3, abs=1e-6)
    torch.testing.assert_close(grad(out.loss, lp), padded_grad(TORCHRL_MINOR_SFT_GRAD), atol=1e-7, rtol=0)
    assert out.kl_to_ref is not None and out.loss_kl_to_ref is None
    with pytest.warns(UserWarning, match="ignored"):
        SFTLoss(None, loss_function="minor_sft", kl_to_ref_coeff=0.1)


def test_fully_masked_row_and_errors():
    lp, mask, ref = fixed_inputs()
    mask = mask.clone()
    mask[1] = False
    lp = lp.requires_grad_(True)
    out = sft_loss(lp, mask, ref_log_probs=ref, kl_to_ref_coeff=0.1)
    two = sft_loss(lp[[0, 2]], mask[[0, 2]], ref_log_probs=ref[[0, 2]], kl_to_ref_coeff=0.1)
    for key, value in two.metrics().items():
        assert out.metrics()[key] == pytest.approx(value, abs=1e-7), key
    g = grad(out.loss, lp)
    assert torch.isfinite(g).all() and float(g[1].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="minor_sft' needs ref_log_probs"):
        sft_loss(lp, mask, loss_function="minor_sft")
    with pytest.raises(ValueError, match="ref_log_probs is missing"):
        sft_loss(lp, mask, kl_to_ref_coeff=0.1)
    with pytest.raises(ValueError, match="mask"):
        sft_loss(lp, mask[:, :3])
    with pytest.raises(ValueError, match="reduction"):
        sft_loss(lp, mask, reduction="avg")


def test_sft_loss_module_on_the_model_assistant_only(hf_model_fp32):
    """SFTLoss on a packed batch: only response_mask tokens count (no training of the shared model)."""
    from llmrl_core.modules.backends.transformers.scoring import score_response_tokens
    from llmrl_core.trainer import TrainSample, pack_samples

    model, tok = hf_model_fp32
    a = TrainSample(tok("Q: 1+1?")["input_ids"], tok(" A: 2. Tool: ok. Done", add_special_tokens=False)["input_ids"])
    n = len(a.response_ids)
    a.response_mask = [i < 4 or i >= n - 2 for i in range(n)]  # the middle stands for tool output
    b = TrainSample(tok("Hi")["input_ids"], tok(" there friend", add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        out = SFTLoss(model)(pack_samples([a, b]))
        means = []
        for s in (a, b):
            lp = score_response_tokens(model, s.prompt_ids, s.response_ids)
            keep = torch.tensor(s.response_mask)
            means.append(-float(lp[keep].mean()))
    assert float(out.loss_sft) == pytest.approx(sum(means) / 2, abs=5e-5)
