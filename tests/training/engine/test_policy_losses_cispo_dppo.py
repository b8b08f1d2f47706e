"""The CISPO and DPPO policy losses: hand-computed losses, gradients and metrics, invariants against
PPO-clip and REINFORCE, loop references, masking, config and one update of the tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: E402  (the train extra is installed by make setup)
from turn_tables import plan_table  # noqa: E402

from agentgym.backends.builder import make_policy  # noqa: E402
from agentgym.backends.config import ModelConfig, TinyModelConfig  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.rollout.records import Turn  # noqa: E402
from agentgym.training.api.aggregation import Aggregation  # noqa: E402
from agentgym.training.api.plugin_set import PluginSet  # noqa: E402
from agentgym.training.config.loading import load_config  # noqa: E402
from agentgym.training.config.schema import LossConfig  # noqa: E402
from agentgym.training.engine.losses import (  # noqa: E402
    AGG_MODES,
    cispo_policy_loss,
    dppo_policy_loss,
    get_policy_loss,
    list_policy_losses,
    policy_loss,
)
from agentgym.training.engine.update import PolicyUpdate  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
LOSSES = {"cispo": cispo_policy_loss, "dppo": dppo_policy_loss}

# --- the hand-computed example -----------------------------------------------------------------------
#
# Two rows of 4 positions. Position 0 is a prompt token in both rows; row 1's last position is padding.
# Response tokens (π_old -> π, so r = π/π_old and Δ = π − π_old):
#
#   row 0, A = +1:  0.5 -> 0.25  (r = 0.5,  Δ = -0.25)
#                   0.001 -> 0.01 (r = 10,  Δ = +0.009)   a rare token that became less rare
#                   0.5 -> 0.75  (r = 1.5,  Δ = +0.25)
#   row 1, A = -1:  0.2 -> 0.1   (r = 0.5,  Δ = -0.1)
#                   0.99 -> 0.8  (r = 0.80808..., Δ = -0.19)  a likely token that lost a lot of mass
#
# PPO-clip (ε = 0.2, dual clip 3): token-mean gradient d/dlogπ = -A·r/5 where the unclipped term wins, else
# 0: row 0: -0.1, 0 (r=10 clipped), 0 (r=1.5 clipped); row 1: 0 (r=0.5 < 0.8 with A<0 clipped),
# +0.80808/5 = +0.161616 (inside [0.8, 1.2]).
#
# CISPO (defaults: no lower bound, ε_high = 0.28): weight ŵ = min(r, 1.28) = 0.5, 1.28, 1.28 | 0.5, 0.80808;
# ℓ = -ŵ·A·logπ:
#   row 0: -0.5·ln .25 = 0.693147, -1.28·ln .01 = 5.894618, -1.28·ln .75 = 0.368233   (sum 6.955998)
#   row 1: +0.5·ln .1 = -1.151293, +0.80808·ln .8 = -0.180318                      (sum -1.331611)
#   token-mean 5.624387/5 = 1.124877; seq-mean-token-mean (6.955998/3 - 1.331611/2)/2 = 0.826430;
#   seq-mean-token-sum 5.624387/2 = 2.812194; seq-mean-token-sum-norm (L = 4) 5.624387/4 = 1.406097.
#   Gradient (token-mean) -ŵ·A/5: -0.1, -0.256, -0.256 | +0.1, +0.161616: nonzero at all three tokens
#   where PPO's is 0. clipfrac 2/5 (r = 10 and 1.5).
#   With cispo_clip_low = 0.2 (ŵ >= 0.8) the two r = 0.5 weights become 0.8: ℓ = 1.109035 and -1.842068,
#   token-mean (7.371886 - 2.022386)/5 = 1.069900, gradient -0.16 and +0.16 there, clipfrac 4/5.
#
# DPPO (δ = 0.15): out of the region where A>0 and Δ > 0.15 (row 0's third token) or A<0 and Δ < -0.15
# (row 1's second token). ℓ = -A·r everywhere (value), gradient -A·r/5 inside, 0 outside:
#   values: -0.5, -10, -1.5 (sum -12) | +0.5, +0.80808 (sum 1.30808);
#   token-mean -10.69192/5 = -2.138384; seq-mean-token-mean (-4 + 0.65404)/2 = -1.672980;
#   seq-mean-token-sum -10.69192/2 = -5.345960; seq-mean-token-sum-norm -10.69192/4 = -2.672980.
#   Gradient: -0.1, -2.0, 0 | +0.1, 0 — PPO's zeros and DPPO's are on different tokens. clipfrac 2/5.
#
# Both: ratio_mean = (0.5 + 10 + 1.5 + 0.5 + 0.80808)/5; approx_kl = -ln(0.5·10·1.5·0.5·0.80808)/5.

MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
P_OLD = torch.tensor([[0.3, 0.5, 0.001, 0.5], [0.4, 0.2, 0.99, 0.6]])
P_NEW = torch.tensor([[0.3, 0.25, 0.01, 0.75], [0.4, 0.1, 0.8, 0.6]])
R_LIKELY = 0.8 / 0.99
RATIOS = [0.5, 10.0, 1.5, 0.5, R_LIKELY]
PPO_GRAD = torch.tensor([[0.0, -0.1, 0.0, 0.0], [0.0, 0.0, R_LIKELY / 5, 0.0]])

CISPO_ROWS = (-0.5 * math.log(0.25) - 1.28 * math.log(0.01) - 1.28 * math.log(0.75),
              0.5 * math.log(0.1) + R_LIKELY * math.log(0.8))
DPPO_ROWS = (-0.5 - 10.0 - 1.5, 0.5 + R_LIKELY)


def by_mode(row0: float, row1: float) -> dict[str, float]:
    """The four aggregations of the example's row sums (3 and 2 tokens, padded width 4)."""
    return {"token-mean": (row0 + row1) / 5, "seq-mean-token-mean": (row0 / 3 + row1 / 2) / 2,
            "seq-mean-token-sum": (row0 + row1) / 2, "seq-mean-token-sum-norm": (row0 + row1) / 4}


def hand_inputs():
    """(logprobs leaf, old, advantages); masked-out positions hold junk, which must change nothing."""
    new, old = P_NEW.log(), P_OLD.log()
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -1.0, -1.0, 0.0]])
    new[0, 0], new[1, 0], new[1, 3] = 1e4, float("nan"), float("-inf")
    old[0, 0], old[1, 3] = float("inf"), -1e6
    adv[0, 0], adv[1, 3] = 123.0, float("nan")
    return new.requires_grad_(True), old, adv


def common_metrics(metrics: dict[str, float]) -> None:
    assert metrics["loss/ratio_mean"] == pytest.approx(sum(RATIOS) / 5, rel=1e-5)
    assert metrics["loss/approx_kl"] == pytest.approx(-math.log(math.prod(RATIOS)) / 5, abs=1e-5)
    assert metrics["loss/dual_clip_frac"] == 0.0
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_cispo_hand_computed_each_aggregation(mode):
    new, old, adv = hand_inputs()
    loss, metrics = cispo_policy_loss(new, old, adv, MASK, LossConfig(loss_agg_mode=mode))
    assert loss.item() == pytest.approx(by_mode(*CISPO_ROWS)[mode], abs=1e-5)
    assert metrics["loss/policy"] == pytest.approx(loss.item())
    assert metrics["loss/clipfrac"] == pytest.approx(0.4)
    common_metrics(metrics)
    assert set(metrics) == set(policy_loss(new, old, adv, MASK, LossConfig())[1])  # ppo_clip's keys


def test_cispo_hand_gradient_reaches_the_tokens_ppo_clip_drops():
    new, old, adv = hand_inputs()
    cispo_policy_loss(new, old, adv, MASK, LossConfig())[0].backward()
    expected = torch.tensor([[0.0, -0.1, -0.256, -0.256], [0.0, 0.1, R_LIKELY / 5, 0.0]])
    torch.testing.assert_close(new.grad, expected)
    ppo_new, old, adv = hand_inputs()
    policy_loss(ppo_new, old, adv, MASK, LossConfig())[0].backward()
    torch.testing.assert_close(ppo_new.grad, PPO_GRAD)
    dropped_by_ppo = (ppo_new.grad == 0) & MASK.bool()
    assert int(dropped_by_ppo.sum()) == 3 and (new.grad[dropped_by_ppo] != 0).all()


def test_cispo_hand_computed_lower_bound():
    new, old, adv = hand_inputs()
    loss, metrics = cispo_policy_loss(new, old, adv, MASK, LossConfig(plugins={"cispo_clip_low": 0.2}))
    row0 = -0.8 * math.log(0.25) - 1.28 * math.log(0.01) - 1.28 * math.log(0.75)
    row1 = 0.8 * math.log(0.1) + R_LIKELY * math.log(0.8)
    assert loss.item() == pytest.approx((row0 + row1) / 5, abs=1e-5)
    assert metrics["loss/clipfrac"] == pytest.approx(0.8)
    loss.backward()
    expected = torch.tensor([[0.0, -0.16, -0.256, -0.256], [0.0, 0.16, R_LIKELY / 5, 0.0]])
    torch.testing.assert_close(new.grad, expected)
    # A larger ε_high stops clipping r = 1.5 (weight 1.5) and caps r = 10 at 5.
    new, old, adv = hand_inputs()
    cispo_policy_loss(new, old, adv, MASK, LossConfig(plugins={"cispo_clip_high": 4.0}))[0].backward()
    assert new.grad[0, 2].item() == pytest.approx(-1.0) and new.grad[0, 3].item() == pytest.approx(-0.3)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_dppo_hand_computed_each_aggregation(mode):
    new, old, adv = hand_inputs()
    loss, metrics = dppo_policy_loss(new, old, adv, MASK, LossConfig(loss_agg_mode=mode))
    assert loss.item() == pytest.approx(by_mode(*DPPO_ROWS)[mode], abs=1e-5)
    assert metrics["loss/policy"] == pytest.approx(loss.item())
    assert metrics["loss/clipfrac"] == pytest.approx(0.4)
    common_metrics(metrics)


def test_dppo_hand_gradient_masks_by_probability_change_not_ratio():
    new, old, adv = hand_inputs()
    dppo_policy_loss(new, old, adv, MASK, LossConfig())[0].backward()
    expected = torch.tensor([[0.0, -0.1, -2.0, 0.0], [0.0, 0.1, 0.0, 0.0]])
    torch.testing.assert_close(new.grad, expected)
    # PPO-clip drops the rare token (r = 10) and the r = 0.5 one with A < 0, and keeps the likely token
    # that fell by 0.19; DPPO does the opposite on all three.
    differ = (PPO_GRAD == 0) != (expected == 0)
    assert differ.sum() == 3 and differ[0, 2] and differ[1, 1] and differ[1, 2]
    # With δ = 0.3 every token is inside the region: the gradient is -A·r/5 everywhere.
    new, old, adv = hand_inputs()
    cfg = LossConfig(plugins={"dppo_tv_low": 0.3, "dppo_tv_high": 0.3})
    loss, metrics = dppo_policy_loss(new, old, adv, MASK, cfg)
    loss.backward()
    everywhere = torch.tensor([[0.0, -0.1, -2.0, -0.3], [0.0, 0.1, R_LIKELY / 5, 0.0]])
    torch.testing.assert_close(new.grad, everywhere)
    assert metrics["loss/clipfrac"] == 0.0
    # Only the side the advantage pushes is limited. Advantages flipped, δ = 0.2: row 0 (A = -1) loses only
    # its first token (Δ = -0.25) and keeps the one that rose by 0.25; row 1 (A = +1) keeps the likely
    # token that fell by 0.19.
    flipped_new, old, adv = hand_inputs()
    flipped_cfg = LossConfig(plugins={"dppo_tv_low": 0.2, "dppo_tv_high": 0.2})
    dppo_policy_loss(flipped_new, old, -adv, MASK, flipped_cfg)[0].backward()
    torch.testing.assert_close(flipped_new.grad, -everywhere * torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))


# --- invariants -------------------------------------------------------------------------------------------


def random_batch(seed: int, *, on_policy: bool = False):
    """(logprobs, old, advantages, mask): 6 rows of 9; row 3 has no response token, row 4 zero advantages.
    Old probabilities are spread over (0.005, 0.995) and log-ratios over about ±1.5, so ratios cross both
    CISPO bounds and probability changes cross both DPPO thresholds."""
    gen = torch.Generator().manual_seed(seed)
    rows, seq = 6, 9
    prompt = torch.tensor([2, 1, 4, 9, 3, 0])
    response = torch.tensor([5, 8, 3, 0, 4, 6])
    pos = torch.arange(seq)
    mask = ((pos >= prompt[:, None]) & (pos < (prompt + response)[:, None])).float()
    old = (0.005 + 0.99 * torch.rand(rows, seq, generator=gen)).log()
    new = old if on_policy else (old + 0.8 * torch.randn(rows, seq, generator=gen)).clamp(max=-1e-4)
    adv = torch.randn(rows, seq, generator=gen) * mask
    adv[4] = 0.0
    return new.clone(), old, adv, mask


def token_terms(loss_mode, lp, olp, a, cfg):
    """Per token, in plain floats: (loss value, its derivative w.r.t. logπ, ratio, clipped?)."""
    r = math.exp(max(-20.0, min(20.0, lp - olp)))
    if loss_mode == "cispo":
        low = 0.0 if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
        high = 1.0 + cfg.cispo_clip_high
        weight = min(max(r, low), high)
        return -weight * a * lp, -weight * a, r, r < low or r > high
    change = math.exp(lp) - math.exp(olp)
    out = (a > 0 and change > cfg.dppo_tv_high) or (a < 0 and change < -cfg.dppo_tv_low)
    return -a * r, 0.0 if out else -a * r, r, out


def loop_reference(loss_mode, new, old, adv, mask, cfg):
    """The loss, d loss / d logπ and metrics by a Python loop over rows and masked tokens."""
    rows, seq = mask.shape
    per_row = [[(t, *token_terms(loss_mode, float(new[i, t]), float(old[i, t]), float(adv[i, t]), cfg))
                for t in range(seq) if mask[i, t]] for i in range(rows)]
    tokens = [len(row) for row in per_row]
    nonempty = sum(1 for n in tokens if n)
    count = sum(tokens)
    grad = torch.zeros(rows, seq, dtype=torch.float64)
    loss = 0.0
    for i, row in enumerate(per_row):
        scale = {"token-mean": 1 / max(count, 1),
                 "seq-mean-token-mean": 1 / (max(nonempty, 1) * max(tokens[i], 1)),
                 "seq-mean-token-sum": 1 / max(nonempty, 1),
                 "seq-mean-token-sum-norm": 1 / seq}[cfg.loss_agg_mode]
        for t, value, slope, _, _ in row:
            loss += value * scale
            grad[i, t] = slope * scale
    flat = [term for row in per_row for term in row]
    metrics = {"loss/clipfrac": sum(c for *_, c in flat) / max(count, 1),
               "loss/ratio_mean": sum(r for *_, r, _ in flat) / max(count, 1),
               "loss/approx_kl": sum(float(old[i, t] - new[i, t]) for i in range(rows) for t in range(seq)
                                     if mask[i, t]) / max(count, 1)}
    return loss, grad, metrics


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["cispo", "dppo"])
def test_matches_loop_reference(seed, mode, loss_mode):
    new, old, adv, mask = random_batch(seed)
    cfg = LossConfig(loss_agg_mode=mode, plugins={"cispo_clip_low": 0.2 if seed == 2 else None})
    leaf = new.clone().requires_grad_(True)
    loss, metrics = LOSSES[loss_mode](leaf, old, adv, mask, cfg)
    loss.backward()
    ref_loss, ref_grad, ref_metrics = loop_reference(loss_mode, new, old, adv, mask, cfg)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(leaf.grad.double(), ref_grad, rtol=1e-5, atol=1e-7)
    for name, value in ref_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert 0 < metrics["loss/clipfrac"] < 1  # the batch does cross the bounds / thresholds
    assert (leaf.grad[3] == 0).all() and (leaf.grad[4] == 0).all()  # no response / zero advantage


@pytest.mark.parametrize("seed", range(3))
def test_cispo_gradient_is_clipped_weight_times_policy_gradient(seed):
    new, old, adv, mask = random_batch(seed)
    cfg = LossConfig()
    leaf = new.clone().requires_grad_(True)
    cispo_policy_loss(leaf, old, adv, mask, cfg)[0].backward()
    weight = (new - old).exp().clamp(max=1.0 + cfg.cispo_clip_high)
    torch.testing.assert_close(leaf.grad, -weight * adv * mask / mask.sum())
    ppo_leaf = new.clone().requires_grad_(True)
    policy_loss(ppo_leaf, old, adv, mask, cfg)[0].backward()
    dropped_by_ppo = (ppo_leaf.grad == 0) & (adv != 0) & mask.bool()
    assert dropped_by_ppo.any() and (leaf.grad[dropped_by_ppo] != 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_dppo_gradient_is_zero_exactly_where_the_rule_says(seed):
    new, old, adv, mask = random_batch(seed)
    cfg = LossConfig(plugins={"dppo_tv_low": 0.1, "dppo_tv_high": 0.2})
    leaf = new.clone().requires_grad_(True)
    _, metrics = dppo_policy_loss(leaf, old, adv, mask, cfg)
    dppo_policy_loss(leaf, old, adv, mask, cfg)[0].backward()
    change = new.exp() - old.exp()
    outside = ((adv > 0) & (change > 0.2)) | ((adv < 0) & (change < -0.1))
    live = mask.bool() & (adv != 0)
    assert (outside & live).any() and (~outside & live).any()
    assert ((leaf.grad == 0) == (outside | ~live)).all()
    torch.testing.assert_close(leaf.grad[~outside], (-adv * (new - old).exp() * mask / mask.sum())[~outside])
    assert metrics["loss/clipfrac"] == pytest.approx(float((outside & live).sum() / mask.sum()))


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["cispo", "dppo"])
def test_on_policy_gradient_is_reinforce_and_ppo_clips(mode, loss_mode):
    """At r = 1 nothing is clipped or masked: both gradients are REINFORCE's, -A·∇logπ aggregated, which
    is also PPO-clip's; DPPO's loss value is PPO-clip's too (-A), CISPO's is REINFORCE's (-A·logπ)."""
    new, old, adv, mask = random_batch(5, on_policy=True)
    cfg = LossConfig(loss_agg_mode=mode)
    leaves = {name: new.clone().requires_grad_(True) for name in ("loss", "ppo", "reinforce")}
    loss, metrics = LOSSES[loss_mode](leaves["loss"], old, adv, mask, cfg)
    ppo, _ = policy_loss(leaves["ppo"], old, adv, mask, cfg)
    reinforce = Aggregation.from_config(cfg).reduce(-adv * leaves["reinforce"], mask)
    for value in (loss, ppo, reinforce):
        value.backward()
    torch.testing.assert_close(leaves["loss"].grad, leaves["reinforce"].grad)
    torch.testing.assert_close(leaves["loss"].grad, leaves["ppo"].grad)
    assert loss.item() == pytest.approx((ppo if loss_mode == "dppo" else reinforce).item(), abs=1e-6)
    assert metrics["loss/clipfrac"] == 0.0 and metrics["loss/approx_kl"] == 0.0
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["cispo", "dppo"])
def test_masked_positions_change_neither_loss_nor_gradients(mode, loss_mode):
    new, old, adv, mask = random_batch(1)
    cfg = LossConfig(loss_agg_mode=mode)

    def run(lp, olp, a):
        leaf = lp.clone().requires_grad_(True)
        loss, metrics = LOSSES[loss_mode](leaf, olp, a, mask, cfg)
        loss.backward()
        return loss.detach(), metrics, leaf.grad

    clean = run(new, old, adv)
    outside = mask == 0
    junk = torch.tensor([1e6, -1e6, float("inf"), float("-inf"), float("nan"), 0.0]).repeat(9)[: mask.numel()]
    dirty = [torch.where(outside, junk.roll(k).view_as(mask), t) for k, t in enumerate((new, old, adv))]
    loss, metrics, grad = run(*dirty)
    assert torch.equal(loss, clean[0]) and metrics == clean[1] and torch.equal(grad, clean[2])
    assert math.isfinite(loss.item()) and (grad[outside] == 0).all()


# --- config, registry and one update -------------------------------------------------------------------


def test_registered_and_listed():
    assert {"cispo", "dppo"} <= set(list_policy_losses())
    assert get_policy_loss("cispo") is cispo_policy_loss and get_policy_loss("dppo") is dppo_policy_loss


def test_the_config_check_finds_them_without_torch():
    probe = ("import sys, json; from agentgym.training.config.loading import load_config; "
             "from agentgym.training.api.plugin_set import PluginSet; "
             "names = [PluginSet.from_config(load_config(None, ['loss.loss_mode=' + m])).policy_loss_name "
             "for m in ('cispo', 'dppo')]; "
             "print(json.dumps([names, any(m == 'torch' or m.startswith('torch.') for m in sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["cispo", "dppo"], False]


def test_loss_config_fields():
    cfg = LossConfig()
    defaults = (cfg.cispo_clip_low, cfg.cispo_clip_high, cfg.dppo_tv_low, cfg.dppo_tv_high)
    assert defaults == (None, 0.28, 0.15, 0.15)
    loaded = load_config(None, ["loss.loss_mode=cispo", "loss.cispo_clip_low=0.5", "loss.cispo_clip_high=4",
                                "loss.dppo_tv_low=0.1", "loss.dppo_tv_high=0.2"]).loss
    assert (loaded.loss_mode, loaded.cispo_clip_low, loaded.cispo_clip_high) == ("cispo", 0.5, 4.0)
    assert (loaded.dppo_tv_low, loaded.dppo_tv_high) == (0.1, 0.2)
    assert load_config(None, ["loss.cispo_clip_low=null"]).loss.cispo_clip_low is None


@pytest.mark.parametrize("field, value", [("cispo_clip_low", -0.1), ("cispo_clip_low", 1.5),
                                          ("cispo_clip_high", -0.1), ("cispo_clip_high", float("nan")),
                                          ("dppo_tv_low", -0.01), ("dppo_tv_high", 1.5),
                                          ("dppo_tv_high", float("nan"))])
def test_loss_config_validation(field, value):
    with pytest.raises(ConfigError, match=f"LossConfig.{field}"):
        LossConfig(plugins={field: value})


@pytest.mark.parametrize("loss_mode", ["cispo", "dppo"])
def test_one_update_of_the_tiny_model(loss_mode):
    cfg = load_config(None, ["algorithm.name=grpo", f"loss.loss_mode={loss_mode}", "loss.kl_coef=0",
                             "optim.num_minibatches=1"])
    plugins = PluginSet.from_config(cfg)
    assert plugins.policy_loss is LOSSES[loss_mode]
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
    model = make_policy(ModelConfig(tiny=tiny, device="cpu"), seed=1).model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    update = PolicyUpdate(model, torch.optim.SGD(model.parameters(), lr=0.5), plugins, cfg.loss, cfg.optim,
                          temperature=1.0, max_length=32, pad_token_id=256, seed=0)
    rng = np.random.default_rng(3)
    turns = [Turn(rng.integers(0, 256, 4).tolist(), rng.integers(0, 256, 3).tolist(), [-5.0, -6.0, -5.5],
                  0.0, str(i)) for i in range(4)]
    metrics = update(turns, np.array([1.0, -1.0, 0.5, -0.5]), plan_table([f"t{i}" for i in range(4)],
                                                                          np.zeros(4, dtype=np.int64)), 1)
    assert math.isfinite(metrics["loss/policy"]) and 0.0 <= metrics["loss/clipfrac"] <= 1.0
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())  # it stepped
