"""The policies that ship with the package (CNN+NAC, and CNN+MHA beside it for CarRacing;
PilotNet+NAC, and PilotNet+GRU beside it for Udacity) load and drive."""

import numpy as np
import pytest
import torch

from nac_drive.policy.loading import load_driving_policy, shipped_cores, shipped_policy_path
from nac_drive.simulators.carracing import eval_seeds, run_episodes

torch.set_num_threads(1)


class Constant:
    def __init__(self, action):
        self.action = action

    def reset(self):
        pass

    def act(self, obs):
        return self.action


SHIPPED = [(task, core) for task in ("carracing", "udacity") for core in shipped_cores(task)]


def test_the_nac_ships_for_each_task_with_mha_beside_it_for_carracing_and_gru_for_udacity():
    assert SHIPPED == [("carracing", "mha"), ("carracing", "nac"), ("udacity", "gru"), ("udacity", "nac")]
    assert shipped_policy_path("carracing") == shipped_policy_path("carracing", "nac")   # the default


@pytest.mark.parametrize("task,core", SHIPPED)
def test_shipped_policy_is_small_and_complete(task, core):
    path = shipped_policy_path(task, core)
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    assert set(files) == {"config.json", "model.safetensors", "README.md"}
    assert files["model.safetensors"] < 5_000_000
    policy = load_driving_policy(f"shipped:{core}", task=task)
    assert policy.config.task == task and policy.config.core.core == core
    assert not policy.training


@pytest.mark.parametrize("task,core", SHIPPED)
def test_each_shipped_policy_has_a_model_card_that_matches_it(task, core):
    # The card (README.md beside the weights) states the architecture and size; a retrained or
    # reconfigured policy whose card was not rewritten fails here.
    policy = load_driving_policy(f"shipped:{core}", task=task)
    card = (shipped_policy_path(task, core) / "README.md").read_text()
    config = policy.config.core
    nac_facts = (f"Top-{config.topk} keys", f"`mode {config.mode}`") if core == "nac" else ()
    heads = (f"{config.num_heads} heads",) if core in ("nac", "mha") else ()   # a recurrent core has none
    for fact in (f"last {config.window} frames", *heads, *nac_facts,
                 f"{sum(p.numel() for p in policy.parameters()) / 1e6:.2f} M parameters",
                 "**Held-out figures**", "**Limits.**", "**Data and recipe.**"):
        assert fact in card, fact


@pytest.mark.parametrize("core", shipped_cores("udacity"))
def test_shipped_udacity_policy_loads_and_steers(core):
    policy = load_driving_policy(f"shipped:{core}", task="udacity")
    assert policy.config.task == "udacity" and policy.config.encoder == "pilotnet"
    road = np.full((160, 320, 3), 90, np.uint8)
    road[:60] = (120, 170, 230)                      # sky over a grey road
    steer = policy.select_action({"image": road, "timestamp": 0.0, "speed": 9.0})
    assert isinstance(steer, float) and -1.0 <= steer <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("core", shipped_cores("carracing"))
def test_shipped_policy_drives_better_than_standing_still_or_flooring_it(core):
    seeds = eval_seeds(2)
    policy = run_episodes(load_driving_policy(f"shipped:{core}"), seeds, max_steps=250)
    assert isinstance(load_driving_policy(f"shipped:{core}").select_action(np.zeros((96, 96, 3), np.uint8)), int)
    for constant in (0, 3):   # no-op, gas
        baseline = run_episodes(Constant(constant), seeds, max_steps=250)
        assert np.mean(policy.returns) > np.mean(baseline.returns) + 20, (policy.returns, baseline.returns)


@pytest.mark.slow
@pytest.mark.parametrize("core", shipped_cores("udacity"))
def test_shipped_udacity_policy_keeps_to_the_lane_of_a_held_out_track(core):
    # 300 frames (20 s) of the emulator's held-out random-900000; both policies measured at
    # 0.029-0.038 m over 2700 frames (BENCHMARKS §11); steering 0 there: 1.17 m.
    from nac_drive.pipeline.drive import drive_checkpoint

    summary = drive_checkpoint(shipped_policy_path("udacity", core), "udacity", episodes=1, max_steps=300,
                               progress=False)
    assert summary["off_road_tracks"] == 0 and summary["mean_abs_cte"] < 0.1, summary
