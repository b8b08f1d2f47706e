"""Loss terms: hand-computed PPO-clip / dual-clip / aggregation, KL estimators, GSPO, masks, gradients,
registry."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

# After the skip above, so that a missing torch skips this file instead of failing it.
from agentgym.errors import ConfigError, RegistryError  # noqa: E402
from agentgym.training.api.aggregation import Aggregation  # noqa: E402
from agentgym.training.api.terms import (  # noqa: E402
    EntropyArgs,
    EntropyTerm,
    ForwardOutputs,
    KLArgs,
    KLTerm,
    total_loss,
)
from agentgym.training.config.schema import LossConfig  # noqa: E402
from agentgym.training.engine.losses import (  # noqa: E402
    AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    entropy_bonus,
    get_policy_loss,
    gspo_policy_loss,
    kl_penalty,
    list_policy_losses,
    policy_loss,
    register_policy_loss,
)
from agentgym.training.engine.packing import TokenBatch  # noqa: E402


def as_batch(mask, advantages, old_logprobs):
    """A TokenBatch around raw (rows, seq) tensors: what loss terms read."""
    rows, seq = mask.shape
    return TokenBatch(torch.zeros(rows, seq, dtype=torch.long), torch.ones(rows, seq, dtype=torch.long),
                      mask, advantages, old_logprobs, torch.arange(rows))


def terms_of(cfg):
    terms = {}
    if cfg.kl_coef:
        terms["kl"] = KLTerm(KLArgs(cfg.kl_coef, cfg.kl_type))
    if cfg.entropy_coef:
        terms["entropy"] = EntropyTerm(EntropyArgs(cfg.entropy_coef))
    return terms


def combined(logprobs, old_logprobs, advantages, mask, cfg=None, *, ref_logprobs=None, entropy=None):
    """Policy loss (cfg.loss_mode) plus the kl and entropy terms the config switches on."""
    cfg = cfg or LossConfig()
    return total_loss(get_policy_loss(cfg.loss_mode or "ppo_clip"), terms_of(cfg),
                      as_batch(mask, advantages, old_logprobs),
                      ForwardOutputs(logprobs, entropy, ref_logprobs), cfg)

# --- the hand-computed example ---------------------------------------------------------------------
#
# Two rows of 4 positions. Position 0 is a prompt token in both rows; row 1's last position is
# padding. Response tokens: row 0 -> positions 1, 2, 3; row 1 -> positions 1, 2 (5 tokens in all).
#
#   ratios ρ (response positions)    row 0: 0.5, 1.0, 1.5      A = +1
#                                    row 1: 0.5, 4.0           A = -1
#
# ε_low = ε_high = 0.2 (clip to [0.8, 1.2]), dual-clip c = 3. Per token ℓ = max(-Aρ, -A·clip(ρ)):
#   row 0 (A = +1): ρ=0.5 -> max(-0.5, -0.8) = -0.5   (not clipped)
#                   ρ=1.0 -> max(-1.0, -1.0) = -1.0   (not clipped)
#                   ρ=1.5 -> max(-1.5, -1.2) = -1.2   (CLIPPED)
#   row 1 (A = -1): ρ=0.5 -> max( 0.5,  0.8) =  0.8   (CLIPPED)
#                   ρ=4.0 -> max( 4.0,  1.2) =  4.0 -> dual clip min(4.0, 3·1) = 3.0 (DUAL)
# Row sums: row 0 = -2.7 (3 tokens, mean -0.9); row 1 = 3.8 (2 tokens, mean 1.9); total 1.1.
#   token-mean              = 1.1 / 5         = 0.22
#   seq-mean-token-mean     = (-0.9 + 1.9) / 2 = 0.5
#   seq-mean-token-sum      = (-2.7 + 3.8) / 2 = 0.55
#   seq-mean-token-sum-norm = 1.1 / 4 (padded width) = 0.275;  with L = 10: 0.11
# clipfrac = 2/5 = 0.4; dual_clip_frac = 1/5 = 0.2; ratio_mean = (0.5+1+1.5+0.5+4)/5 = 1.5;
# approx_kl = mean(log π_old − log π) = −(ln .5 + 0 + ln 1.5 + ln .5 + ln 4)/5 = −ln(1.5)/5.

MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
RATIOS = torch.tensor([[1.0, 0.5, 1.0, 1.5], [1.0, 0.5, 4.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-3.0, -1.0, -2.0, -0.7]])
HAND_EXPECTED = {
    "token-mean": 0.22,
    "seq-mean-token-mean": 0.5,
    "seq-mean-token-sum": 0.55,
    "seq-mean-token-sum-norm": 0.275,
}


def hand_inputs(garbage: bool = True):
    """(logprobs leaf, old, advantages); masked positions hold junk unless ``garbage`` is False."""
    new = OLD + RATIOS.log()
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, -1.0, 0.0]])
    old = OLD.clone()
    if garbage:
        new[0, 0], new[1, 0], new[1, 3] = 1e4, float("nan"), float("-inf")
        old[0, 0], old[1, 3] = float("inf"), -1e6
        adv[0, 0], adv[1, 3] = 123.0, float("nan")
    return new.requires_grad_(True), old, adv


@pytest.mark.parametrize("mode", AGG_MODES)
def test_hand_computed_ppo_clip_each_aggregation(mode):
    new, old, adv = hand_inputs()
    loss, metrics = policy_loss(new, old, adv, MASK, LossConfig(loss_agg_mode=mode))
    assert loss.item() == pytest.approx(HAND_EXPECTED[mode], abs=1e-6)
    assert metrics["loss/policy"] == pytest.approx(HAND_EXPECTED[mode], abs=1e-6)
    assert metrics["loss/clipfrac"] == pytest.approx(0.4)
    assert metrics["loss/dual_clip_frac"] == pytest.approx(0.2)
    assert metrics["loss/ratio_mean"] == pytest.approx(1.5, abs=1e-6)
    assert metrics["loss/approx_kl"] == pytest.approx(-math.log(1.5) / 5, abs=1e-6)
    assert all(isinstance(v, float) for v in metrics.values())


def test_hand_computed_constant_normaliser_and_clip_variants():
    new, old, adv = hand_inputs()
    cfg = LossConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_agg_norm_tokens=10)
    assert policy_loss(new, old, adv, MASK, cfg)[0].item() == pytest.approx(0.11, abs=1e-6)
    # No dual clip: row 1's second token keeps ℓ = 4.0 -> (-2.7 + 0.8 + 4.0) / 5 = 0.42.
    loss, metrics = policy_loss(new, old, adv, MASK, LossConfig(dual_clip_c=None))
    assert loss.item() == pytest.approx(0.42, abs=1e-6)
    assert metrics["loss/dual_clip_frac"] == 0.0
    # Clip-higher ε_high = 0.28: ρ=1.5 -> -1.28, so (-0.5 - 1 - 1.28 + 0.8 + 3) / 5 = 0.204.
    higher, _ = policy_loss(new, old, adv, MASK, LossConfig(clip_ratio_high=0.28))
    assert higher.item() == pytest.approx(0.204)


def test_hand_computed_gradient():
    # d loss / d logπ = -A·ρ / 5 on unclipped tokens (token-mean), 0 on clipped and dual-clipped ones:
    # row 0: ρ=0.5 -> -0.1, ρ=1 -> -0.2, ρ=1.5 clipped -> 0; row 1: clipped -> 0, dual -> 0.
    new, old, adv = hand_inputs()
    policy_loss(new, old, adv, MASK, LossConfig())[0].backward()
    expected = torch.tensor([[0.0, -0.1, -0.2, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(new.grad, expected)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["ppo_clip", "gspo"])
def test_gradient_at_ratio_one_is_minus_advantage_over_normaliser(mode, loss_mode):
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]],
                        dtype=torch.float32)
    adv = torch.randn(4, 1, generator=gen).expand(4, 5) * mask
    old = torch.randn(4, 5, generator=gen)
    new = old.clone().requires_grad_(True)
    loss, metrics = get_policy_loss(loss_mode)(new, old, adv, mask, LossConfig(loss_agg_mode=mode))
    loss.backward()
    tokens = mask.sum(-1, keepdim=True)
    nonempty_rows = int((tokens > 0).sum())  # 3: the empty row 2 is left out of row means
    normaliser = {
        "token-mean": mask.sum(),
        "seq-mean-token-mean": nonempty_rows * tokens.clamp(min=1),
        "seq-mean-token-sum": torch.tensor(float(nonempty_rows)),
        "seq-mean-token-sum-norm": torch.tensor(5.0),
    }[mode]
    torch.testing.assert_close(new.grad, -adv * mask / normaliser)
    assert metrics["loss/clipfrac"] == 0.0 and metrics["loss/approx_kl"] == 0.0
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0)


# --- aggregation: loop reference ---------------------------------------------------------------------


def aggregate_reference(values, mask, mode, norm_tokens=None):
    """Per-row Python loop over masked tokens."""
    rows, seq = values.shape
    row_tokens = []
    for i in range(rows):
        row_tokens.append([float(values[i, t]) for t in range(seq) if mask[i, t] != 0])
    total = sum(sum(r) for r in row_tokens)
    count = sum(len(r) for r in row_tokens)
    nonempty = [r for r in row_tokens if r]
    if mode == "token-mean":
        return total / count if count else 0.0
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty) if nonempty else 0.0
    return total / (seq if norm_tokens is None else norm_tokens)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_loop_reference(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    rows, seq = int(torch.randint(1, 7, (), generator=gen)), int(torch.randint(1, 12, (), generator=gen))
    values = torch.randn(rows, seq, generator=gen) * 3
    mask = (torch.rand(rows, seq, generator=gen) < 0.5).float()
    if seed % 2:
        mask[0] = 0.0  # an empty row
    if seed == 4:
        mask.zero_()  # nothing to average
    for norm in (None, 7):
        got = aggregate(values, mask, mode, norm_tokens=norm).item()
        assert got == pytest.approx(aggregate_reference(values, mask, mode, norm), abs=1e-5)


def test_aggregate_errors():
    values = torch.zeros(2, 3)
    with pytest.raises(ConfigError, match="did you mean 'token-mean'"):
        aggregate(values, values, "token_mean")
    with pytest.raises(ConfigError, match="shape"):
        aggregate(values, torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="norm_tokens"):
        aggregate(values, values, "seq-mean-token-sum-norm", norm_tokens=0)


# --- KL ------------------------------------------------------------------------------------------------


def test_kl_estimators_on_known_numbers():
    lp = torch.tensor([[0.0, -1.0, -2.0, 0.5, -30.0]])
    ref = torch.tensor([[0.0, 0.0, -1.0, 0.0, 0.0]])
    # k1 = lp - ref
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), torch.tensor([[0.0, -1.0, -1.0, 0.5, -30.0]]))
    # k2 = (lp - ref)^2 / 2
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), torch.tensor([[0.0, 0.5, 0.5, 0.125, 450.0]]))
    # k3: d = ref - lp = [0, 1, 1, -0.5, 30 -> clamped to 20]; e^d - d - 1 = [0, e-2, e-2, e^-.5 - .5,
    # e^20 - 21 -> clamped to 10]
    e = math.e
    expected = torch.tensor([[0.0, e - 2, e - 2, math.exp(-0.5) - 0.5, 10.0]])
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), expected)


def test_k3_is_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(0)
    lp, ref = torch.randn(8, 16, generator=gen) * 4, torch.randn(8, 16, generator=gen) * 4
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert torch.equal(kl_penalty(lp, lp, "k3"), torch.zeros_like(lp))
    with pytest.raises(ConfigError, match="kl_type"):
        kl_penalty(lp, ref, "k4")


# --- GSPO ---------------------------------------------------------------------------------------------


def gspo_sequence_form(new, old, row_adv, mask, low, high):
    """GSPO's sequence-level objective, written per row: s_i = exp(mean log ratio), mean over rows."""
    losses = []
    for i in range(new.shape[0]):
        keep = mask[i].bool()
        s = torch.exp((new[i][keep] - old[i][keep]).mean())
        a = row_adv[i]
        losses.append(torch.maximum(-a * s, -a * s.clamp(1 - low, 1 + high)))
    return torch.stack(losses).mean()


def test_gspo_hand_example():
    # Response log-ratios: row 0 [0.3, -0.1, 0.1] -> mean 0.1, s_0 = e^0.1 = 1.105171 (inside [0.8, 1.2]),
    # A = +1 -> ℓ = -1.105171. Row 1 [0.5, 0.3] -> mean 0.4, s_1 = e^0.4 = 1.491825, A = -1 ->
    # ℓ = max(1.491825, 1.2) = 1.491825 (below the dual bound 3). seq-mean-token-mean:
    # (-1.105171 + 1.491825) / 2 = 0.193327. The ratio used at every token is its row's s_i:
    # ratio_mean = (3·1.105171 + 2·1.491825) / 5 = 1.259832.
    log_ratio = torch.tensor([[0.0, 0.3, -0.1, 0.1], [0.0, 0.5, 0.3, 0.0]])
    new = (OLD + log_ratio).requires_grad_(True)
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, -1.0, 0.0]])
    cfg = LossConfig(loss_agg_mode="seq-mean-token-mean")
    loss, metrics = gspo_policy_loss(new, OLD, adv, MASK, cfg)
    assert loss.item() == pytest.approx(0.193327, abs=1e-5)
    assert metrics["loss/ratio_mean"] == pytest.approx(1.259832, abs=1e-5)
    # Row 1's clip to 1.2 gives the smaller term (1.2 < 1.49), so clipping is never the active side.
    assert metrics["loss/clipfrac"] == 0.0
    # With A = +1 on row 1 the clipped term wins there: ℓ = -1.2 on its 2 tokens -> clipfrac 2/5.
    _, flipped = gspo_policy_loss(new, OLD, adv.abs(), MASK, cfg)
    assert flipped["loss/clipfrac"] == pytest.approx(2 / 5)
    assert flipped["loss/policy"] == pytest.approx((-1.105171 - 1.2) / 2, abs=1e-5)
    same, _ = policy_loss(new, OLD, adv, MASK, LossConfig(loss_agg_mode="seq-mean-token-mean"),
                          sequence_ratio=True)
    assert same.item() == loss.item()


@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_form_equals_sequence_form_with_constant_row_advantages(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, seq = 5, 9
    mask = (torch.rand(rows, seq, generator=gen) < 0.6).float()
    mask[:, 0] = 0.0
    mask[:, 1] = 1.0
    old = torch.randn(rows, seq, generator=gen)
    new_seq = (old + 0.2 * torch.randn(rows, seq, generator=gen)).requires_grad_(True)
    new_tok = new_seq.detach().clone().requires_grad_(True)
    row_adv = torch.randn(rows, generator=gen)
    cfg = LossConfig(loss_agg_mode="seq-mean-token-mean", dual_clip_c=None, clip_ratio_low=0.1,
                     clip_ratio_high=0.15)
    token_form, _ = get_policy_loss("gspo")(new_tok, old, row_adv[:, None] * mask, mask, cfg)
    sequence_form = gspo_sequence_form(new_seq, old, row_adv, mask, 0.1, 0.15)
    assert token_form.item() == pytest.approx(sequence_form.item(), abs=1e-6)
    token_form.backward()
    sequence_form.backward()
    torch.testing.assert_close(new_tok.grad, new_seq.grad)


def test_gspo_caps_the_log_sequence_ratio():
    mask = torch.ones(1, 3)
    new = torch.full((1, 3), 50.0)
    _, metrics = gspo_policy_loss(new, torch.zeros(1, 3), -torch.ones(1, 3), mask,
                                  LossConfig(dual_clip_c=None))
    assert metrics["loss/ratio_mean"] == pytest.approx(math.exp(10.0), rel=1e-5)


# --- masks ----------------------------------------------------------------------------------------------


def masked_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows, seq = 4, 10
    prompt = torch.tensor([2, 3, 1, 4])
    response = torch.tensor([5, 2, 6, 0])  # the last row has no response tokens
    pos = torch.arange(seq)
    mask = ((pos >= prompt[:, None]) & (pos < (prompt + response)[:, None])).float()
    tensors = {
        "logprobs": -torch.rand(rows, seq, generator=gen) * 3,
        "old_logprobs": -torch.rand(rows, seq, generator=gen) * 3,
        "advantages": torch.randn(rows, 1, generator=gen).expand(rows, seq) * mask,
        "ref_logprobs": -torch.rand(rows, seq, generator=gen) * 3,
        "entropy": torch.rand(rows, seq, generator=gen) * 2,
    }
    return mask, tensors


def loss_and_grads(mask, tensors, cfg):
    leaves = {k: v.clone().requires_grad_(k in ("logprobs", "entropy")) for k, v in tensors.items()}
    loss, metrics = combined(
        leaves["logprobs"],
        leaves["old_logprobs"],
        leaves["advantages"],
        mask,
        cfg,
        ref_logprobs=leaves["ref_logprobs"],
        entropy=leaves["entropy"],
    )
    loss.backward()
    return loss.detach(), metrics, leaves["logprobs"].grad, leaves["entropy"].grad


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["ppo_clip", "gspo"])
@pytest.mark.parametrize("kl_type", ["k1", "k3"])
def test_masked_positions_change_neither_loss_nor_gradients(mode, loss_mode, kl_type):
    mask, clean = masked_batch()
    cfg = LossConfig(loss_agg_mode=mode, loss_mode=loss_mode, kl_coef=0.3, kl_type=kl_type, entropy_coef=0.05)
    loss, metrics, grad_lp, grad_ent = loss_and_grads(mask, clean, cfg)
    assert math.isfinite(loss.item())
    outside = mask == 0
    gen = torch.Generator().manual_seed(7)
    junk_values = [1e6, -1e6, float("inf"), float("-inf"), float("nan"), 0.0]
    for trial in range(3):
        dirty = {}
        for name, value in clean.items():
            noise = torch.randn(value.shape, generator=gen) * 100
            noise.view(-1)[: len(junk_values)] = torch.tensor(junk_values).roll(trial)
            dirty[name] = torch.where(outside, noise, value)
        loss2, metrics2, grad_lp2, grad_ent2 = loss_and_grads(mask, dirty, cfg)
        assert torch.equal(loss, loss2)
        assert metrics == metrics2
        assert torch.equal(grad_lp, grad_lp2) and torch.equal(grad_ent, grad_ent2)
    assert (grad_lp[outside] == 0).all() and (grad_ent[outside] == 0).all()
    # Each term really contributes inside the mask.
    assert (grad_ent[~outside] != 0).all()
    assert set(metrics) >= {"loss/policy", "loss/kl", "loss/entropy", "loss/total", "loss/clipfrac"}


def test_total_loss_combines_terms():
    mask, t = masked_batch(3)
    cfg = LossConfig(kl_coef=0.2, entropy_coef=0.01, kl_type="k3")
    loss, metrics = combined(
        t["logprobs"], t["old_logprobs"], t["advantages"], mask, cfg,
        ref_logprobs=t["ref_logprobs"], entropy=t["entropy"],
    )
    policy, _ = policy_loss(t["logprobs"], t["old_logprobs"], t["advantages"], mask, cfg)
    kl = aggregate(kl_penalty(t["logprobs"], t["ref_logprobs"], "k3"), mask)
    ent = entropy_bonus(t["entropy"], mask)
    assert loss.item() == pytest.approx((policy + 0.2 * kl - 0.01 * ent).item(), abs=1e-6)
    assert metrics["loss/kl"] == pytest.approx(kl.item())
    assert metrics["loss/entropy"] == pytest.approx(ent.item())
    assert metrics["loss/total"] == pytest.approx(loss.item())
    # Without ref/entropy (and zero coefficients) only the policy term and total are reported.
    _, plain = combined(t["logprobs"], t["old_logprobs"], t["advantages"], mask)
    assert "loss/kl" not in plain and "loss/entropy" not in plain and "loss/total" in plain


def test_the_policy_loss_and_terms_reduce_with_the_minibatch_aggregation():
    """A micro-batch 4 tokens wide of a minibatch 10 wide: under seq-mean-token-sum-norm with no L set, the
    policy loss and the kl and entropy terms all divide by the minibatch's 10 (``outputs.agg``), not by 4."""
    new, old, adv = hand_inputs()
    _, t = masked_batch()
    cfg = LossConfig(loss_agg_mode="seq-mean-token-sum-norm", kl_coef=0.3, kl_type="k1", entropy_coef=0.05)
    ref, entropy = t["ref_logprobs"][:2, :4], t["entropy"][:2, :4]
    agg = Aggregation.from_config(cfg).for_minibatch(torch.zeros(2, 10))
    assert agg == Aggregation("seq-mean-token-sum-norm", 10)
    loss, metrics = total_loss(get_policy_loss("ppo_clip"), terms_of(cfg), as_batch(MASK, adv, old),
                               ForwardOutputs(new, entropy, ref, agg=agg), cfg)
    assert metrics["loss/policy"] == pytest.approx(0.11, abs=1e-6)  # 1.1 / 10, the hand example
    kl = torch.where(MASK.bool(), new.detach() - ref, 0.0).sum().item() / 10  # k1 over the response tokens
    assert metrics["loss/kl"] == pytest.approx(kl, abs=1e-5)
    assert metrics["loss/entropy"] == pytest.approx((entropy * MASK).sum().item() / 10, abs=1e-6)
    assert loss.item() == pytest.approx(0.11 + 0.3 * kl - 0.05 * metrics["loss/entropy"], abs=1e-5)
    # Without an aggregation, total_loss takes cfg's, whose L is then this batch's own width (4).
    _, alone = total_loss(get_policy_loss("ppo_clip"), {}, as_batch(MASK, adv, old), ForwardOutputs(new), cfg)
    assert alone["loss/policy"] == pytest.approx(0.275, abs=1e-6)


def test_total_loss_needs_inputs_for_its_coefficients():
    mask, t = masked_batch()
    args = (t["logprobs"], t["old_logprobs"], t["advantages"], mask)
    with pytest.raises(ConfigError, match="reference log-probs"):
        combined(*args, LossConfig(kl_coef=0.1))
    with pytest.raises(ConfigError, match="entropies"):
        combined(*args, LossConfig(entropy_coef=0.1))
    with pytest.raises(RegistryError, match="Did you mean 'ppo_clip'"):
        combined(*args, LossConfig(loss_mode="ppo_clp"))


# --- config and registry ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"loss_agg_mode": "mean"}, "loss_agg_mode"),
        ({"kl_type": "low_var_kl"}, "kl_type"),
        ({"clip_ratio_low": -0.1}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
        ({"dual_clip_c": 1.0}, "dual_clip_c"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"entropy_coef": float("nan")}, "entropy_coef"),
        ({"loss_agg_norm_tokens": 0}, "loss_agg_norm_tokens"),
        ({"loss_mode": ""}, "loss_mode"),
    ],
)
def test_loss_config_validation(kwargs, field):
    with pytest.raises(ConfigError, match=f"LossConfig.{field}"):
        LossConfig(**kwargs)


def test_registry_builtins_duplicates_and_suggestions():
    assert {"ppo_clip", "gspo"} <= set(list_policy_losses())
    assert get_policy_loss("ppo_clip") is policy_loss
    assert get_policy_loss("gspo") is gspo_policy_loss
    with pytest.raises(RegistryError, match="already registered"):
        register_policy_loss("ppo_clip")(lambda *args: None)
    with pytest.raises(RegistryError, match="Did you mean 'gspo'"):
        get_policy_loss("gpso")
    with pytest.raises(RegistryError, match="non-empty"):
        register_policy_loss("")

    def first(logprobs, old_logprobs, advantages, mask, cfg, agg):
        return logprobs.sum() * 0, {"loss/policy": 0.0}

    def second(logprobs, old_logprobs, advantages, mask, cfg, agg):
        return logprobs.sum() * 0, {"loss/policy": 1.0}

    try:
        register_policy_loss("test_custom")(first)
        register_policy_loss("test_custom")(first)  # same function again: not a conflict
        with pytest.raises(RegistryError, match="override=True"):
            register_policy_loss("test_custom")(second)
        register_policy_loss("test_custom", override=True)(second)
        mask, t = masked_batch()
        _, metrics = combined(t["logprobs"], t["old_logprobs"], t["advantages"], mask,
                              LossConfig(loss_mode="test_custom"))
        assert metrics["loss/policy"] == 1.0
    finally:
        POLICY_LOSSES.unregister("test_custom")
