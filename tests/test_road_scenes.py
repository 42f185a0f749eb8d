"""The Fig. 4 claim on scenes read from the road: classes by curvature, the literal thresholds
and the direction-free AUROC with block-bootstrap intervals, on synthetic traces whose units are
known."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nac_drive.interpret.fig4 import SCENES
from nac_drive.interpret.road_scenes import CURVE, STRAIGHT, road_classes, road_scenes


def _run(seed=0, episodes=3, steps=240, stretch=30):
    """A trace-like run: curvature in stretches of left (+0.03), straight, right (-0.03) and gentle
    bends; head 0's tau = 1.2 - 0.35 * sign(curvature) (right high, as the paper), head 0's phi / tau
    = sign(curvature) (left high: the other way), head 1 noise."""
    rng = np.random.default_rng(seed)
    n = episodes * steps
    curvature = np.repeat(rng.choice([0.03, 0.0, -0.03, 0.005], size=n // stretch), stretch)
    curvature += rng.normal(0, 1e-4, n)
    sign = np.sign(curvature) * (np.abs(curvature) >= CURVE)
    tau = np.stack([1.2 - 0.35 * sign, rng.uniform(0.8, 1.6, n)], axis=1)[:, :, None]          # [N, H=2, K=1]
    steady = np.stack([sign, rng.normal(size=n)], axis=1)[:, :, None]
    return SimpleNamespace(
        path=Path("synthetic"), metadata={}, num_steps=n, episode=np.repeat(np.arange(episodes), steps),
        has_nac=np.ones(n, bool), has_scene=True, curvature=curvature, cross_track_error=rng.normal(0, 1, n),
        heading_error=rng.normal(0, 0.1, n), speed=rng.uniform(20, 80, n), tau=tau, phi=steady * tau,
        logits=rng.uniform(0, 1, (n, 2, 1)), weights=np.ones((n, 2, 1)), key_step=np.zeros((n, 2, 1), np.int64))


def _effect(report, comparison, quantity, head):
    return next(e for e in report["effects"]
                if (e["comparison"], e["quantity"], e["head"]) == (comparison, quantity, head))


def test_road_classes_follow_the_curvature_thresholds_left_positive():
    curvature = np.array([2 * CURVE, CURVE, CURVE / 2, STRAIGHT, 0.0, -STRAIGHT, -CURVE, np.nan])
    names = [SCENES[i] if i >= 0 else None for i in road_classes(curvature)]
    assert names == ["left", "left", None, "straight", "straight", "straight", "right", None]


def test_a_unit_equal_to_the_curvature_sign_separates_left_from_right_and_noise_does_not():
    report = road_scenes(_run(), resamples=200)
    tau_sign, noise = _effect(report, "right_vs_left", "tau", 0), _effect(report, "right_vs_left", "tau", 1)
    assert tau_sign["auroc"] == pytest.approx(1.0) and tau_sign["effect"] == pytest.approx(0.5)
    assert tau_sign["effect_ci95"][0] > 0.45
    assert abs(noise["auroc"] - 0.5) < 0.1 and noise["effect_ci95"][0] == 0.0   # its interval holds 0.5
    steady = _effect(report, "right_vs_left", "steady_logits", 0)
    assert steady["auroc"] == pytest.approx(0.0) and steady["effect"] == pytest.approx(0.5)   # direction-free
    assert report["qualitative"]["tau"]["heads_separating"] == [0]
    assert report["qualitative"]["tau"]["heads_paper_direction"] == [0]
    assert report["qualitative"]["steady_logits"]["heads_separating"] == [0]
    assert report["qualitative"]["steady_logits"]["heads_paper_direction"] == []
    # the paper's literal thresholds hold for head 0's tau only
    assert report["literal"]["claims"]["tau"] == {"verdict": "reproduced", "heads": [0]}
    assert "tau reproduced (heads 0)" in report["verdict"]["literal"]
    assert "tau separated (the paper's direction, heads 0)" in report["verdict"]["qualitative"]
    assert sum(report["classes"].values()) < 720 and min(report["classes"].values()) > 0   # gentle bends in none


def test_too_few_curves_is_untestable_and_a_trace_without_scene_is_refused():
    run = _run()
    run.curvature = np.zeros_like(run.curvature)           # all straight: no left or right curve
    report = road_scenes(run, resamples=50)
    assert all(q["verdict"] == "untestable" for q in report["qualitative"].values())
    assert report["literal"]["claims"]["tau"]["verdict"] == "untestable"
    run.has_scene = False
    with pytest.raises(ValueError, match="no scene"):
        road_scenes(run)
