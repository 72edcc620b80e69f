"""The loop's parts: spike detector, LR schedules, weight-decay groups, z-loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lm_ablate.config import OptimConfig, RegularizationConfig
from lm_ablate.metrics import SpikeDetector
from lm_ablate.optim import build_schedule
from lm_ablate.regularization import Regularizer


def _reference_spikes(values, window, k):
    """Independent statement of the definition: x_t > mean + k * std of the previous `window` values."""
    flags = []
    for t, v in enumerate(values):
        prev = np.asarray(values[max(0, t - window) : t])
        flags.append(len(prev) == window and v > prev.mean() + k * prev.std())
    return flags


def test_spike_detector_matches_definition():
    rng = np.random.default_rng(0)
    values = list(1.0 + 0.05 * rng.standard_normal(300))
    for t in (40, 41, 120, 250):
        values[t] = 3.0
    det = SpikeDetector(window=20, k=6.0)
    flags = [det.update(v) for v in values]
    assert flags == _reference_spikes(values, 20, 6.0)
    assert det.count == sum(flags) >= 3  # 40, 120, 250 at least; 41 is masked by 40 inside the window
    assert flags[40] and flags[120] and flags[250]
    assert not any(flags[:20])  # never before the window is full


def test_spike_detector_ignores_nonfinite_and_round_trips():
    det = SpikeDetector(window=5, k=2.0)
    for v in [1.0, 1.1, 0.9, 1.0, 1.05, float("nan"), float("inf")]:
        det.update(v)
    assert len(det.values) == 5 and det.count == 0
    clone = SpikeDetector(window=99, k=1.0)
    clone.load_state_dict(det.state_dict())
    for v in [1.0, 5.0, 1.0, 0.98, 7.0]:
        assert clone.update(v) == det.update(v)
    assert clone.count == det.count == 2


def _schedule(**kw):
    cfg = OmegaConf.structured(OptimConfig(name="adamw", **kw))
    return build_schedule(cfg, 100)


def test_cosine_with_warmup():
    s = _schedule(schedule="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(99) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert s(int(mid)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))
    assert all(s(i) >= s(i + 1) for i in range(10, 99))


def test_constant_and_no_warmup():
    s = _schedule(schedule="constant", warmup_steps=0)
    assert {s(i) for i in range(100)} == {1.0}
    assert _schedule(schedule="cosine", warmup_steps=0)(0) == 1.0


def _tiny_model():
    from lm_ablate.config import compose
    from lm_ablate.model import TransformerLM

    cfg = compose(["model=tiny", "norm=layernorm", "position=learned", "activation=gelu", "activation.bias=true"])
    return TransformerLM(cfg, 64)


@pytest.mark.parametrize("emb, norms", [(False, False), (True, False), (False, True)])
def test_weight_decay_groups(emb, norms):
    model = _tiny_model()
    reg = Regularizer(RegularizationConfig(name="standard", decay_embeddings=emb, decay_norms_and_biases=norms))
    decay, no_decay = reg.param_groups(model)
    decayed = {id(p) for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(no_decay["params"]) == len(list(model.parameters()))
    assert id(model.blocks[0].attn.qkv.weight) in decayed
    assert id(model.head.weight) in decayed
    assert (id(model.embed.weight) in decayed) == emb
    assert (id(model.position.table.weight) in decayed) == emb
    assert (id(model.blocks[0].attn_residual.norm.weight) in decayed) == norms
    assert (id(model.blocks[0].ffn.up.bias) in decayed) == norms


def test_z_loss_term():
    logits = torch.randn(2, 5, 11) * 3
    targets = torch.randint(0, 11, (2, 5))
    total, ce, z = Regularizer(RegularizationConfig(name="zloss", z_loss=1e-2)).loss(logits, targets)
    log_z = torch.logsumexp(logits, dim=-1)
    torch.testing.assert_close(z, 1e-2 * (log_z**2).mean())
    torch.testing.assert_close(ce, torch.nn.functional.cross_entropy(logits.view(-1, 11), targets.view(-1)))
    torch.testing.assert_close(total, ce + z)
    total0, _, z0 = Regularizer(RegularizationConfig(name="standard")).loss(logits, targets)
    assert z0.item() == 0 and torch.equal(total0, ce)


def test_wsd_schedule():
    s = _schedule(schedule="wsd", warmup_steps=5, decay_fraction=0.2, min_lr_ratio=0.0)
    assert s(0) == pytest.approx(0.2) and s(4) == pytest.approx(1.0)
    assert all(s(i) == 1.0 for i in range(5, 80))  # stable
    assert s(80) == pytest.approx(1 - 1 / 20) and s(99) == pytest.approx(0.0)  # linear decay over the last 20
    assert all(s(i) > s(i + 1) for i in range(80, 99))


def test_inverse_sqrt_schedule():
    s = _schedule(schedule="inverse_sqrt", warmup_steps=10)
    assert s(9) == pytest.approx(1.0) and s(4) == pytest.approx(0.5)
    assert s(39) == pytest.approx(math.sqrt(10 / 40))
    # shape of Vaswani et al. eq. 3: d^-0.5 * min(s^-0.5, s * w^-1.5), up to its constant
    for step in (0, 3, 9, 20, 77):
        n = step + 1
        assert s(step) / min(n**-0.5, n * 10**-1.5) == pytest.approx(10**0.5)
    assert _schedule(schedule="inverse_sqrt", warmup_steps=0)(3) == pytest.approx(0.5)


def test_spike_threshold_is_exactly_mean_plus_k_std():
    det = SpikeDetector(window=4, k=2.0)
    for v in [1.0, 2.0, 3.0, 4.0]:
        det.update(v)
    window = np.array([1.0, 2.0, 3.0, 4.0])
    threshold = window.mean() + 2.0 * window.std()  # population std
    assert det.threshold() == pytest.approx(threshold)
    probe = SpikeDetector(window=4, k=2.0)
    probe.load_state_dict(det.state_dict())
    assert not probe.update(threshold - 1e-6)
    assert det.update(threshold + 1e-6)
