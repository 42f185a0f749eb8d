"""Combined actions: the 5 discrete CarRacing actions plus steering with gas."""

from __future__ import annotations

import json
import zipfile

import gymnasium as gym
import numpy as np
import pytest

from nac_drive.agents.combined_actions import (
    COMBINED_ACTIONS, LEFT_GAS, RIGHT_GAS, CombinedActions, check_action_table, widen_action_head)
from nac_drive.agents.discrete_to_continuous import DISCRETE_AS_CONTINUOUS
from nac_drive.agents.ppo_expert import PPOExpert, load_policy, shipped_expert_path
from nac_drive.simulators.carracing import EXPERT_TRAIN_SEED_BASE, GAS, RIGHT, make_carracing, run_episodes


def _drive(plan) -> np.ndarray:
    """Speed and heading of the car after each combined action of ``plan``."""
    env = CombinedActions(make_carracing(continuous=True))
    env.reset(seed=EXPERT_TRAIN_SEED_BASE)
    path = []
    for action in plan:
        env.step(action)
        hull = env.unwrapped.car.hull
        path.append([np.linalg.norm(hull.linearVelocity), hull.angle])
    env.close()
    return np.array(path)


def test_steering_with_gas_turns_and_accelerates_at_once():
    np.testing.assert_array_equal(COMBINED_ACTIONS[:5], DISCRETE_AS_CONTINUOUS)
    start = [GAS] * 30  # a moving car
    steer = _drive(start + [RIGHT] * 15)[-16:]
    steer_gas = _drive(start + [RIGHT_GAS] * 15)[-16:]
    left_gas = _drive(start + [LEFT_GAS] * 15)[-16:]
    turned = lambda path: path[-1, 1] - path[0, 1]  # noqa: E731
    # both turn the same way by a similar angle; only the one with gas speeds up
    assert turned(steer) < -0.05 and turned(steer_gas) < -0.05 and turned(left_gas) > 0.05
    assert steer[-1, 0] < steer[0, 0] < steer_gas[-1, 0]
    assert steer_gas[-1, 0] - steer_gas[0, 0] > 2.0


def test_combined_actions_refuse_bad_envs_and_tables():
    with pytest.raises(ValueError, match="continuous CarRacing"):
        CombinedActions(make_carracing(continuous=False))
    box = gym.spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
    for bad, match in [([[0, 0]], "shape"), ([[0, 0, 0], [0, float("nan"), 0]], "outside"),
                       ([[0, 0, 0], [0, 1.5, 0]], "outside"), ([["a", 0, 0], [0, 0, 0]], "numbers")]:
        with pytest.raises(ValueError, match=match):
            check_action_table(bad, box)
    with pytest.raises(ValueError, match="new_action_offset"):
        widen_action_head(None, None, new_action_offset=0.0)


@pytest.mark.slow
def test_combined_run_starts_from_the_discrete_expert_and_drives_as_it(tmp_path):
    import torch

    from nac_drive.agents.ppo_expert import make_vec_env, train
    from nac_drive.agents.ppo_expert_args import TrainArgs

    tiny = dict(out=str(tmp_path), n_envs=1, n_steps=8, batch_size=8, n_epochs=1, total_frames=32,
                eval_every_frames=10**9, progress_bar=False, learning_rate=0.0)
    zip_path = train(TrainArgs(run_name="comb", combined_actions=True, init_from=str(shipped_expert_path()), **tiny))
    assert zip_path.parent.name == "comb"
    combined = load_policy(zip_path)
    discrete = load_policy(shipped_expert_path()).policy
    assert combined.action_kind == "combined" and combined.continuous
    np.testing.assert_array_equal(combined.action_table, COMBINED_ACTIONS)

    # on states the discrete expert visits: the same most likely action, and each new action
    # exp(-3) as likely as the steering it adds gas to
    venv = make_vec_env(continuous=False)
    venv.seed(EXPERT_TRAIN_SEED_BASE + 7)
    obs, states = venv.reset(), []
    for _ in range(60):
        states.append(obs)
        obs, *_ = venv.step(np.array([discrete.predict(obs, deterministic=True)[0][0]]))
    venv.close()
    states = torch.as_tensor(np.concatenate(states))
    with torch.no_grad():
        p5 = discrete.get_distribution(states).distribution.probs
        p7 = combined.policy.get_distribution(states).distribution.probs
    assert torch.equal(p5.argmax(1), p7.argmax(1)) and len(set(p5.argmax(1).tolist())) >= 2
    torch.testing.assert_close(p7[:, :5] / p7[:, :5].sum(1, keepdim=True), p5)
    torch.testing.assert_close(p7[:, 5:], p7[:, [RIGHT, 2]] * np.exp(-3.0))

    # ... so it drives the continuous env exactly as the discrete expert drives the discrete one
    widened = run_episodes(PPOExpert(zip_path), [EXPERT_TRAIN_SEED_BASE + 3], continuous=True, max_steps=240)
    stock = run_episodes(PPOExpert(), [EXPERT_TRAIN_SEED_BASE + 3], continuous=False, max_steps=240)
    assert widened.returns == stock.returns and widened.returns[0] > 50

    # a combined zip goes on as a combined run, not into another kind
    again = train(TrainArgs(run_name="again", combined_actions=True, init_from=str(zip_path), **tiny))
    torch.testing.assert_close(load_policy(again).policy.action_net.bias, combined.policy.action_net.bias)
    with pytest.raises(ValueError, match="combined actions"):
        train(TrainArgs(run_name="bad", init_from=str(zip_path), **tiny))
    with pytest.raises(ValueError, match="exclude each other"):
        train(TrainArgs(run_name="both", combined_actions=True, continuous=True, **tiny))
    assert not (tmp_path / "both").exists()


def test_load_policy_checks_the_stored_action_table(tmp_path):
    def with_data(name, **fields):
        with zipfile.ZipFile(shipped_expert_path()) as src, zipfile.ZipFile(tmp_path / name, "w") as dst:
            for item in src.infolist():
                data = src.read(item.filename)
                if item.filename == "data":
                    data = json.dumps({**json.loads(data), **fields}).encode()
                dst.writestr(item, data)
        return tmp_path / name

    five_rows = with_data("five.zip", action_table=DISCRETE_AS_CONTINUOUS.tolist())
    loaded = load_policy(five_rows)   # a table for the 5 actions: driven through the continuous env
    assert loaded.action_kind == "combined" and PPOExpert(five_rows).continuous
    with pytest.raises(ValueError, match="rows.zip.*'action_table' has 7 rows"):
        load_policy(with_data("rows.zip", action_table=COMBINED_ACTIONS.tolist()))
    with pytest.raises(ValueError, match="range.zip.*'action_table'.*outside"):
        load_policy(with_data("range.zip", action_table=(DISCRETE_AS_CONTINUOUS * 2).tolist()))
