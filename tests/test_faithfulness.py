"""Saliency faithfulness (nac_drive.interpret.faithfulness): RISE deletion / insertion and
the model-randomisation sanity check, on models whose right answer is known."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from nac_drive.interpret.faithfulness import (ATTRIBUTIONS, CASCADE, auc, cam_grid,
                                              complete_integrated_gradients, deletion_insertion, frame_blocks,
                                              integrated_gradients_maps, paired_against_random, random_cam_grid_maps,
                                              random_maps, random_patch_maps, randomized_policy, resolve_target,
                                              saliency_faithfulness, spearman)

torch.set_num_threads(1)
SIZE = 16


class LinearLogit(nn.Module):
    """Two logits: ``w . x`` (a fixed weighted sum of the pixels) and 0."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(0.1 * torch.randn(3, SIZE, SIZE, generator=g), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = (x * self.weight).flatten(1).sum(1)
        return torch.stack([logit, torch.zeros_like(logit)], dim=1)


def _frames(n: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def _exact(model: LinearLogit, frames: torch.Tensor) -> np.ndarray:
    """The exact attribution of logit 0: weight x input, summed over channels, min-max scaled."""
    m = (frames * model.weight).sum(1).numpy()
    low, high = m.min(axis=(1, 2), keepdims=True), m.max(axis=(1, 2), keepdims=True)
    return (m - low) / (high - low)


def test_auc_is_the_trapezoid_rule():
    # even steps 0, .25, .5, .75, 1: .25 * ((0+1) + (1+.5) + (.5+.5) + (.5+1)) / 2
    assert auc(np.array([0.0, 1.0, 0.5, 0.5, 1.0])) == pytest.approx(0.625)
    # uneven fractions: 0.1 * 1 + 0.9 * (1 + 0) / 2
    assert auc(np.array([1.0, 1.0, 0.0]), np.array([0.0, 0.1, 1.0])) == pytest.approx(0.55)
    np.testing.assert_allclose(auc(np.array([[1.0, 1.0], [0.0, 1.0]])), [1.0, 0.5])   # one area per row
    with pytest.raises(ValueError, match="fractions"):
        auc(np.ones(3), np.array([0.0, 1.0]))


def test_the_exact_attribution_beats_random_maps_in_deletion_and_insertion():
    model, x = LinearLogit(), _frames()
    exact = deletion_insertion(model, x, _exact(model, x), target=0, steps=16)
    noise = deletion_insertion(model, x, random_maps(model, x, seed=3), target=0, steps=16)
    assert exact["deletion_auc"].mean() < noise["deletion_auc"].mean() - 0.15
    assert exact["insertion_auc"].mean() > noise["insertion_auc"].mean() + 0.05   # (near 1: saturated softmax)
    assert (exact["deletion_auc"] < noise["deletion_auc"]).all()
    assert (exact["insertion_auc"] > noise["insertion_auc"]).all()
    # the curves' ends are known: nothing moved = the frame's probability; all deleted = a black
    # frame (logit 0, probability 1/2); all inserted = the frame again
    p = torch.sigmoid(model(x)[:, 0]).double().numpy()
    np.testing.assert_allclose(exact["deletion"][:, 0], p, atol=1e-6)
    np.testing.assert_allclose(exact["deletion"][:, -1], 0.5, atol=1e-6)
    np.testing.assert_allclose(exact["insertion"][:, -1], p, atol=1e-6)
    np.testing.assert_allclose(exact["fractions"], np.linspace(0, 1, 17))
    np.testing.assert_allclose(exact["deletion_auc"], auc(exact["deletion"]))


def test_deletion_scores_the_signed_output_of_a_regression_target():
    model, x = LinearLogit(), _frames(4)
    out = deletion_insertion(model, x, _exact(model, x), target="steer-", steps=4, score="output")
    np.testing.assert_allclose(out["deletion"][:, 0], -model(x)[:, 0].numpy(), atol=1e-5)   # -output[0]
    np.testing.assert_allclose(out["deletion"][:, -1], 0.0, atol=1e-6)
    with pytest.raises(ValueError, match="maps"):
        deletion_insertion(model, x, np.zeros((4, 8, 8)), target=0)


def test_integrated_gradients_of_a_linear_model_is_weight_times_input():
    model, x = LinearLogit(), _frames(3)
    expected = (x * model.weight).abs().sum(1).numpy()
    expected /= expected.max(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(integrated_gradients_maps(model, x, target=0), expected, atol=1e-4)


def test_every_registered_method_gives_unit_maps_at_the_input_size():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * SIZE * SIZE, 2))
    x = _frames(2)
    for name in ("gradcam", "integrated_gradients", "occlusion", "random", "random_cam_grid", "random_patches"):
        maps = ATTRIBUTIONS[name](model, x, "predicted", seed=0)
        assert maps.shape == (2, SIZE, SIZE) and maps.dtype == np.float32, name
        assert maps.min() >= 0 and maps.max() <= 1 and maps.std() > 0, name
    np.testing.assert_array_equal(random_maps(model, x, seed=5), random_maps(model, x, seed=5))
    assert not np.array_equal(random_maps(model, x, seed=5), random_maps(model, x, seed=6))


def test_targets_resolve_to_an_index_and_a_sign():
    out = torch.tensor([[0.3, 2.0], [-0.5, 1.0]])
    index, sign = resolve_target(out, "steer")
    assert index.tolist() == [0, 0] and sign.tolist() == [1.0, -1.0]
    assert resolve_target(out, "predicted")[0].tolist() == [1, 1]
    assert resolve_target(out, "steer-", steer_index=1)[1].tolist() == [-1.0, -1.0]
    with pytest.raises(ValueError, match="target"):
        resolve_target(out, 7)


def test_spearman_knows_its_extremes_ties_and_maps():
    a = np.random.default_rng(0).normal(size=50)
    assert spearman(a, a ** 3) == pytest.approx(1.0)          # monotone: rank correlation 1
    assert spearman(a, -a) == pytest.approx(-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # a constant map: NaN, and no warning
        assert np.isnan(spearman(a, np.zeros(50)))
    b = np.round(np.random.default_rng(1).normal(size=50), 1)
    assert len(np.unique(b)) < 40                              # with ties
    # Pearson's r of the tie-averaged ranks (1, 2.5, 2.5, 4 for 10, 20, 20, 30), computed another way
    averaged = [np.array([np.flatnonzero(np.sort(x) == v).mean() + 1 for v in x]) for x in (a, b)]
    assert spearman(a, b) == pytest.approx(np.corrcoef(*averaged)[0, 1], abs=1e-12)
    # maps of any shape are flattened alike; sizes that differ are refused
    assert spearman(a.reshape(5, 10), b.reshape(10, 5)) == pytest.approx(spearman(a, b))
    with pytest.raises(ValueError, match="same number of values"):
        spearman(a, b[:49])


def _small_policy():
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    return DrivingPolicy(PolicyConfig(core=CoreConfig(window=4, d_model=16, num_heads=2, topk=2))).eval()


def test_randomized_policy_cascades_from_the_head():
    policy = _small_policy()
    before = {n: p.clone() for n, p in policy.named_parameters()}
    for stage in CASCADE:
        clone = randomized_policy(policy, stage, seed=0)
        changed = {n.split(".")[0] for n, p in clone.named_parameters() if not torch.equal(p, before[n])}
        assert changed == set(CASCADE[:CASCADE.index(stage) + 1]), stage
    for n, p in policy.named_parameters():     # the policy itself is untouched
        assert torch.equal(p, before[n])
    with pytest.raises(ValueError, match="stage"):
        randomized_policy(policy, "everything")


def _edges(frame_model, frames, target, seed=0):
    """A broken 'attribution': the input's edges, which ignores the model."""
    g = frames.mean(1)
    dx, dy = (g[:, :, 1:] - g[:, :, :-1]).abs(), (g[:, 1:] - g[:, :-1]).abs()
    m = torch.zeros_like(g)
    m[:, :, 1:] += dx
    m[:, 1:] += dy
    return (m / m.flatten(1).max(1).values[:, None, None]).numpy()


def test_the_sanity_check_tells_a_model_explanation_from_an_edge_detector(tmp_path):
    from support.synthetic_runs import make_synthetic_run

    make_synthetic_run(tmp_path, steps=24, with_saliency=False)
    methods = {"gradcam": ATTRIBUTIONS["gradcam"], "integrated_gradients": ATTRIBUTIONS["integrated_gradients"],
               "random": ATTRIBUTIONS["random"], "edges": _edges}
    result = saliency_faithfulness(_small_policy(), tmp_path, methods=methods, max_frames=5, steps=8,
                                   progress=False, sanity_frames=4)
    assert result["frames"] == 5 and result["frame_indices"] == [0, 6, 12, 17, 23]   # spread evenly
    assert result["sanity_frames"] == 4
    assert set(result["methods"]) == set(methods) and result["score"] == "probability"
    sanity = {name: {stage: s["mean"] for stage, s in m["sanity_spearman"].items()}
              for name, m in result["methods"].items()}
    assert all(result["methods"][m]["sanity_spearman"][stage]["frames"] == 4 for m in ("edges", "random")
               for stage in CASCADE)
    assert sanity["edges"]["encoder"] > 0.99 and sanity["random"]["encoder"] > 0.99    # they ignore the model
    assert sanity["gradcam"]["encoder"] < 0.6
    assert sanity["integrated_gradients"]["encoder"] < 0.8
    for m in result["methods"].values():
        for key in ("deletion_auc", "insertion_auc"):
            s = m[key]
            assert s["frames"] == 5 and s["ci95"][0] <= s["mean"] <= s["ci95"][1] and 0 <= s["mean"] <= 1
    # one episode of 5 frames: stretches of ceil(5 ** (1/3)) = 2 frames are the blocks
    assert result["blocks"] == {"by": "time", "frames_per_block": 2, "count": 3}
    assert set(result["paired"]) == {"gradcam", "integrated_gradients", "edges"}
    for against in result["paired"].values():
        assert set(against) == {"random"}
        for key in ("deletion_auc", "insertion_auc"):
            assert against["random"][key]["items"] == 5 and against["random"][key]["blocks"] == 3
    import json
    json.dumps(result, allow_nan=False)        # JSON-able as it is


def test_bad_methods_are_refused(tmp_path):
    from support.synthetic_runs import make_synthetic_run

    make_synthetic_run(tmp_path, steps=3, with_saliency=False)
    with pytest.raises(ValueError, match="methods"):
        saliency_faithfulness(_small_policy(), tmp_path, methods=["gradcam", "lime"], progress=False)
    with pytest.raises(ValueError, match="max_frames"):
        saliency_faithfulness(_small_policy(), tmp_path, max_frames=0, progress=False)


def test_a_steering_policy_is_scored_by_its_signed_steering(tmp_path):
    """Udacity (regression): the score is the steering output towards the direction steered."""
    from support.synthetic_runs import make_synthetic_run
    from support.udacity_test_policies import untrained_udacity_policy

    make_synthetic_run(tmp_path, steps=4, frame_size=(160, 320), with_saliency=False)
    result = saliency_faithfulness(untrained_udacity_policy(), tmp_path, methods=["gradcam", "occlusion", "random"],
                                   max_frames=2, steps=4, cascade=("head",), progress=False)
    assert result["score"] == "output" and result["frames"] == 2
    for m in result["methods"].values():
        assert m["deletion_auc"]["frames"] == 2 and np.isfinite(m["insertion_auc"]["mean"])


# ------------------------------------------------------ paired, block-bootstrap comparisons
class ConvLinear(nn.Module):
    """A linear image model with a convolution (a 4 x 4 grid for Grad-CAM): two logits,
    ``w . x`` (through the conv and a linear layer, no bias) and 0."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 2, kernel_size=4, stride=4, bias=False)
        self.linear = nn.Linear(2 * (SIZE // 4) ** 2, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = self.linear(self.conv(x).flatten(1))[:, 0]
        return torch.stack([logit, torch.zeros_like(logit)], dim=1)

    def exact_maps(self, frames: torch.Tensor) -> np.ndarray:
        """Its exact attribution of logit 0 (the model is linear): gradient x input, summed
        over channels, min-max scaled."""
        x = frames.clone().requires_grad_(True)
        self(x)[:, 0].sum().backward()
        m = (x.grad * frames).sum(1).numpy()
        low, high = m.min(axis=(1, 2), keepdims=True), m.max(axis=(1, 2), keepdims=True)
        return (m - low) / (high - low)


def test_random_baselines_have_the_granularity_of_the_method_they_stand_beside():
    model, x = ConvLinear(), _frames(3)
    assert cam_grid(model, x) == (SIZE // 4, SIZE // 4)
    coarse = random_cam_grid_maps(model, x, seed=2)
    assert coarse.shape == (3, SIZE, SIZE) and 0 <= coarse.min() and coarse.max() <= 1
    # bilinear from a 4 x 4 grid: neighbouring pixels differ far less than pixel noise does
    assert np.abs(np.diff(coarse, axis=2)).mean() < 0.5 * np.abs(np.diff(random_maps(model, x, seed=2), axis=2)).mean()
    patches = random_patch_maps(model, x, seed=2, parts=4)
    blocks = patches.reshape(3, 4, SIZE // 4, 4, SIZE // 4)
    assert (blocks == blocks[:, :, :1, :, :1]).all()                        # constant within a patch
    assert len(np.unique(patches[0])) == 16                                  # one value per patch
    np.testing.assert_array_equal(random_cam_grid_maps(model, x, seed=2), coarse)   # seeded


def test_frame_blocks_are_episodes_or_stretches_that_never_cross_an_episode():
    many = np.repeat(np.arange(12), 5)
    labels, rule = frame_blocks(many)
    assert rule == {"by": "episode", "frames_per_block": None, "count": 12}
    np.testing.assert_array_equal(labels, many)
    few = np.repeat([3, 7], [10, 5])
    labels, rule = frame_blocks(few, block_frames=4)
    assert rule == {"by": "time", "frames_per_block": 4, "count": 5}
    np.testing.assert_array_equal(labels, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 4])
    assert frame_blocks(np.zeros(27, dtype=int))[1]["frames_per_block"] == 3       # ceil(27 ** (1/3))


def _ar1(n: int, phi: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros(n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal()
    return x


def test_the_block_bootstrap_widens_the_interval_of_autocorrelated_frames_only():
    from nac_drive.simulators.episode_stats import block_mean_interval, mean_interval

    def widths(values):
        blocks, _ = frame_blocks(np.zeros(len(values), dtype=int))
        low, high = block_mean_interval(values, blocks)
        independent = mean_interval(values)                # each frame resampled on its own
        return high - low, independent[1] - independent[0]

    block, independent = widths(_ar1(500, 0.9))        # neighbouring frames alike
    assert block > 1.5 * independent
    block, independent = widths(_ar1(500, 0.0))        # independent frames: about the same
    assert 0.7 * independent < block < 1.4 * independent


def test_an_exact_map_beats_coarse_and_fine_random_maps_in_paired_deletion():
    model, x = ConvLinear(), _frames(40)
    maps = {"exact": model.exact_maps(x), "random": random_maps(model, x, seed=1),
            "random_cam_grid": random_cam_grid_maps(model, x, seed=1),
            "random_patches": random_patch_maps(model, x, seed=1, parts=4)}
    deletion = {name: deletion_insertion(model, x, m, target=0, steps=16)["deletion_auc"] for name, m in maps.items()}
    paired = paired_against_random(deletion, np.zeros(40, dtype=int))
    assert set(paired) == {"exact"} and set(paired["exact"]) == {"random", "random_cam_grid", "random_patches"}
    for baseline, change in paired["exact"].items():
        assert change["items"] == 40 and change["blocks"] == 10                   # 4 frames a block
        assert change["ci95"][1] < 0, baseline                                     # lower deletion AUC, surely
        assert change["ci95"][0] <= change["mean"] <= change["ci95"][1]
        assert change["mean"] == pytest.approx(float((deletion["exact"] - deletion[baseline]).mean()))
    # a random map against another random map of the same kind: no difference it can tell
    again = {"candidate": deletion_insertion(model, x, random_maps(model, x, seed=9), target=0)["deletion_auc"],
             "random": deletion["random"]}
    low, high = paired_against_random(again, np.zeros(40, dtype=int))["candidate"]["random"]["ci95"]
    assert low < 0 < high


# ------------------------------------------------- Integrated Gradients until complete
def _steep(x: torch.Tensor) -> torch.Tensor:
    """``[B, ...]`` -> ``[B]``: a sigmoid of the mean pixel, steep about 0.5 (curved along IG's path)."""
    return torch.sigmoid(40 * (x.flatten(1).mean(1) - 0.5))


def test_integrated_gradients_doubles_its_steps_until_complete():
    x = 0.8 + 0.2 * torch.rand(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    black = torch.zeros_like(x)
    # eight steps alone miss the output's change by more than 5% on this curve ...
    _, eight = complete_integrated_gradients(_steep, x, black, first_steps=8, max_steps=8)
    assert eight["steps"] == 8 and not eight["complete"]
    assert (eight["error"] / eight["difference"]).max() > 0.05
    # ... so the steps double until every sample's attribution sums to within 5% of it
    attr, doubled = complete_integrated_gradients(_steep, x, black, first_steps=8)
    assert doubled["complete"] and doubled["steps"] in (16, 32, 64, 128, 256)
    assert (doubled["error"] / doubled["difference"]).max() < 0.05
    change = (_steep(x) - _steep(black)).detach().double().numpy()
    np.testing.assert_allclose(doubled["difference"], np.abs(change))
    np.testing.assert_allclose(attr.flatten(1).sum(1).double().numpy(), change, rtol=0.05)
    # a linear model is complete at once
    model = LinearLogit()
    _, linear = complete_integrated_gradients(lambda f: model(f)[:, 0], _frames(2), torch.zeros(2, 3, SIZE, SIZE))
    assert linear["steps"] == 8 and linear["complete"]
    with pytest.raises(ValueError, match="first_steps"):
        complete_integrated_gradients(_steep, x, black, first_steps=16, max_steps=8)
