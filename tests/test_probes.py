"""Linear probes and the push along a probe (nac_drive.interpret.probes, probe_steering, explain's
push section): a hand-built policy whose core output carries the curve ahead in one unit, and
whose steering reads that unit, is found by the curvature probe on held-out episodes (far above
the shuffled control, which stays near 0), and its steering follows a push along the probe with
the sign and size the head's weight gives, open loop and while it drives, where a policy that
steers by another unit does not; a variable the frames do not show is not found."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nac_drive.interpret.probe_steering import push_verdict, steering
from nac_drive.interpret.probes import block_permutation, fit_probe, held_out_groups, linear_probes
from support.curve_runs import GAIN, curve_run, steering_policy, turning_policy

torch.set_num_threads(1)


def test_the_probe_finds_the_unit_the_steering_reads_and_the_steering_follows_a_push(tmp_path):
    from nac_drive.pipeline.explain import probes_section

    run = curve_run(tmp_path)
    section = probes_section(run, steering_policy(), seed=0)
    assert section["held_out"] == "episodes" and section["groups"] == 3
    assert set(section["skipped"]) == {"q", "k", "v", "heads"} and "core is gru" in section["skipped"]["heads"]
    assert set(section["variables_skipped"]) == {"cross_track_error", "heading_error"}
    scores = {row["variable"]: row for row in section["scores"]}
    assert [row["representation"] for row in section["scores"]] == ["core", "core"]
    curve, speed = scores["curvature"], scores["speed"]
    assert curve["r2"] > 0.95 and curve["r2_ci95"][0] > 0.9
    assert abs(curve["control_r2"]) < 0.3 and curve["above_control_ci95"][0] > 0.6
    assert speed["r2"] < 0.2 and speed["r2_ci95"][0] < 0                # the frames do not show it
    assert "curvature by core" in section["verdict"] and "speed by none" in section["verdict"]

    push = section["intervention"]
    assert push["verdict"] == "follows" and push["steering"] == "steering output (positive right)"
    changes = {row["push"]: row["change"]["mean"] for row in push["pushes"]}
    expected = GAIN * push["sds"] * np.std(3000 / 255 * run.curvature)   # the spread of core unit 0, pushed
    assert changes["left"] < 0 < changes["right"] and changes["left"] == pytest.approx(-changes["right"])
    assert abs(changes["left"]) == pytest.approx(expected, rel=0.3)
    assert abs(changes["random +"]) < abs(changes["left"]) and push["random_directions"]["outdone"] == 1.0
    left = next(row for row in push["pushes"] if row["push"] == "left")
    assert left["probe_change"] > 0 and left["change"]["ci95"][1] < 0     # the probe reads a left curve


def test_a_variable_the_frames_do_not_show_stays_at_the_controls_level():
    rng = np.random.default_rng(1)
    episode = np.repeat(np.arange(4), 200)
    x = rng.normal(size=(800, 6))
    unrelated = np.repeat(rng.normal(size=40), 20)                       # slow, autocorrelated, unseen
    result = linear_probes({"core": x}, {"curvature": unrelated, "speed": x[:, 2] + 0.1 * rng.normal(size=800)},
                           episode, resamples=200)
    rows = {row["variable"]: row for row in result["scores"]}
    assert rows["speed"]["r2"] > 0.95 and rows["speed"]["above_control_ci95"][0] > 0.8
    assert rows["curvature"]["r2"] < 0.05 and rows["curvature"]["above_control_ci95"][0] < 0
    assert result["verdict"].endswith("curvature by none; speed by core (R^2 0.99)")


def test_a_block_permutation_moves_whole_blocks_and_short_runs_are_cut_in_stretches():
    blocks = np.repeat([0, 1, 2, 3], [5, 3, 4, 2])
    order = block_permutation(blocks, seed=3)
    assert sorted(order) == list(range(14))
    moved = blocks[order]
    assert [len(list(g)) for g in np.split(moved, np.flatnonzero(np.diff(moved)) + 1)] == \
        [int((blocks == b).sum()) for b in dict.fromkeys(moved)]           # each block arrives whole, in order
    groups, kind = held_out_groups(np.zeros(30, int))
    assert kind == "stretches of 6 steps" and np.unique(groups).size == 5
    with pytest.raises(ValueError, match="4 training steps or more"):
        fit_probe(np.zeros((3, 2)), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"representations\['core'\]: expected \[10, units\]"):
        linear_probes({"core": np.zeros((9, 2))}, {}, np.zeros(10))


def test_a_discrete_policys_steering_is_its_expected_turn():
    names = ["noop", "left", "right", "gas", "brake"]
    outputs = np.log(np.array([[0.1, 0.6, 0.1, 0.1, 0.1], [0.2, 0.0 + 1e-12, 0.8, 0.0 + 1e-12, 0.0 + 1e-12]]))
    steer, what = steering(outputs, names)
    assert what == "P(right) - P(left)" and steer == pytest.approx([-0.5, 0.8])
    assert steering(outputs, None)[0].tolist() == outputs[:, 0].tolist()      # a steering policy: output 0
    with pytest.raises(ValueError, match="actions named 'left' and 'right'"):
        steering(outputs, ["a", "b", "c", "d", "e"])


def test_a_push_that_a_random_direction_outdoes_is_not_called_followed():
    def pushes(left, right):
        return [{"push": "left", "change": {"ci95": left}}, {"push": "right", "change": {"ci95": right}}]

    assert push_verdict(pushes([-0.3, -0.1], [0.1, 0.3]), outdone=1.0) == "follows"
    assert push_verdict(pushes([-0.3, -0.1], [0.1, 0.3]), outdone=0.5) == "follows no more than a random direction"
    assert push_verdict(pushes([0.1, 0.3], [-0.3, -0.1]), outdone=1.0) == "opposite"
    assert push_verdict(pushes([0.1, 0.3], [-0.3, -0.1]), outdone=0.5) == "opposite no more than a random direction"
    assert push_verdict(pushes([-0.3, 0.1], [0.1, 0.3]), outdone=1.0) == "no clear effect"
    assert push_verdict(pushes(None, [0.1, 0.3]), outdone=1.0) == "no clear effect"


def test_the_steering_follows_a_push_along_the_probe_while_the_policy_drives(tmp_path, monkeypatch):
    """Closed loop: each push driven on the same 3 short CarRacing tracks as the intact policy,
    paired per track. The policy that turns by the curve unit follows it (left steers left,
    right steers right, both intervals clear of 0, beyond every random direction); one that
    turns by the corner's noise unit does not (the probe hardly reads that unit)."""
    from nac_drive.pipeline.explain import PUSH_RANDOM, curvature_probe, push_section, replay_representations
    from nac_drive.simulators.carracing import ACTION_NAMES

    run = curve_run(tmp_path, action_names=ACTION_NAMES)
    follows, ignores = turning_policy(0), turning_policy(1)
    replayed = replay_representations(run, follows)   # the same core outputs for both: only the heads differ
    pushed = curvature_probe(run, follows, replayed=replayed)
    probes = {"intervention": {"verdict": "follows"}}   # all the push asks of probes_section: it pushed open loop
    push = push_section(run, follows, probes, tracks=3, max_steps=40, pushes=lambda: pushed)
    assert push["probe"] == push_section(run, follows, probes, tracks=1, max_steps=5)["probe"]   # fitted alike alone
    assert push["seeds"] == [900000, 900001, 900002] and push["metric"] == "return"
    assert push["steering"] == "P(right) - P(left)" and len(push["intact"]["track_steering"]) == 3
    assert [row["push"] for row in push["pushes"]] == ["left", "right"] + [f"random {i + 1}" for i in range(PUSH_RANDOM)]
    rows = {row["push"]: row for row in push["pushes"]}
    left, right = rows["left"]["change"], rows["right"]["change"]
    assert left["ci95"][1] < 0 < right["ci95"][0] and rows["left"]["probe_change"] > 0
    random = push["random_directions"]
    assert random["count"] == PUSH_RANDOM and random["outdone"] == 1.0
    assert random["max_abs_change"] < min(abs(left["mean"]), abs(right["mean"])) / 4
    assert [row["norm"] for row in push["pushes"]] == pytest.approx([rows["left"]["norm"]] * (2 + PUSH_RANDOM))
    assert push["verdict"] == "follows"
    assert len(push["intact"]["track_offset"]) == 3 and np.isfinite(push["intact"]["track_offset"]).all()
    assert push["offset"]["random_directions"]["count"] == PUSH_RANDOM and push["offset"]["verdict"]
    for row in push["pushes"]:   # each track's return paired with its intact drive
        assert row["paired"]["mean"] == pytest.approx(np.mean(row["returns"]) - np.mean(push["intact"]["returns"]))
        assert row["return_change"] == row["paired"]["mean"] and len(row["track_steering"]) == 3
        assert row["change"]["mean"] == pytest.approx(row["mean_steering"] - push["intact_steering"])
        offsets = np.subtract(row["track_offset"], push["intact"]["track_offset"])
        assert row["offset_change"]["mean"] == pytest.approx(offsets.mean())

    import nac_drive.pipeline.explain as explain_module

    # given the same tracks' intact figures (the closed loop's), the push drives only its pushes
    driven, drive = [], explain_module.intervened_drive
    monkeypatch.setattr(explain_module, "intervened_drive",
                        lambda policy, intervention, **kw: driven.append(intervention) or drive(policy, intervention, **kw))
    again = push_section(run, follows, probes, tracks=3, max_steps=40, pushes=lambda: pushed, intact=push["intact"])
    assert len(driven) == 2 + PUSH_RANDOM and all(shift is not None for shift in driven) and again == push

    from nac_drive.pipeline.explain import DriveLog

    log = DriveLog()   # a push killed after two drives goes on with them, read back from the explain's partial file

    def killed_after_two(policy, intervention, **kw):
        if len(log.done) == 2:
            raise KeyboardInterrupt
        return drive(policy, intervention, **kw)

    monkeypatch.setattr(explain_module, "intervened_drive", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        push_section(run, follows, probes, tracks=3, max_steps=40, pushes=lambda: pushed, log=log)
    assert list(log.done) == ["intact", "left"]
    driven.clear()
    monkeypatch.setattr(explain_module, "intervened_drive",
                        lambda policy, intervention, **kw: driven.append(intervention) or drive(policy, intervention, **kw))
    resumed = push_section(run, follows, probes, tracks=3, max_steps=40, pushes=lambda: pushed,
                           log=DriveLog(json.loads(json.dumps(log.done))))
    assert len(driven) == 1 + PUSH_RANDOM and resumed == push

    other = push_section(run, ignores, probes, tracks=3, max_steps=40, pushes=lambda: pushed)
    assert other["verdict"] != "follows"
    assert abs(other["pushes"][0]["change"]["mean"]) < abs(left["mean"]) / 10

    from nac_drive.cli.commands.explain import format_push
    from nac_drive.interpret.dashboard import build_dashboard
    from nac_drive.pipeline.explain import EXPLAIN_FILE, write_report
    from support.dashboard_pages import run_data

    text = format_push(push)
    assert text[0].endswith(": follows") and text[1].startswith("  left") and "return change" in text[1]
    assert len(text) == 1 + len(push["pushes"]) + 2 and "random directions" in text[-2]
    assert text[-1] == f"  the offset from the centre line: {push['offset']['verdict']}"
    write_report(tmp_path / EXPLAIN_FILE, {"trace_sha256": run.sha256, "push": push})
    table = run_data(build_dashboard(tmp_path).read_text())["figures"]["explain_push"]["data"][0]
    assert table["cells"]["values"][0] == [row["push"] for row in push["pushes"]]
    assert table["cells"]["values"][2] == pytest.approx([row["change"]["mean"] for row in push["pushes"]])


def test_a_drive_with_no_intervention_is_the_plain_drive():
    """intervened_drive intact, reading the steering or not, or under a zero shift of the core's
    output: the returns of the plain drive (PolicyDriver on run_episodes)."""
    from functools import partial

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.interpret.probe_steering import steering_values
    from nac_drive.pipeline.explain import intervened_drive
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
    from nac_drive.simulators.carracing import ACTION_NAMES, run_episodes

    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4))).eval()
    seeds = [900000, 900001]
    plain = [float(r) for r in run_episodes(PolicyDriver(policy), seeds, max_steps=40).returns]
    drive = partial(intervened_drive, policy, task="carracing", seeds=seeds, max_steps=40)
    intact, zero = drive(None), drive(np.zeros(policy.core.out_dim))
    read = drive(None, steering_of=partial(steering_values, list(ACTION_NAMES)))
    assert intact["returns"] == zero["returns"] == read["returns"] == plain and "track_steering" not in intact
    assert len(read["track_steering"]) == 2 and all(-1 <= s <= 1 for s in read["track_steering"])
    assert len(read["track_offset"]) == 2 and np.isfinite(read["track_offset"]).all()


def test_a_udacity_drive_reads_the_steering_output_and_is_otherwise_the_plain_drive():
    """The emulator's tracks: reading the steering (output 0) changes nothing of the drive, and
    a shift of the core's output that the head turns into steering shows in it."""
    from functools import partial

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.interpret.probe_steering import steering_values
    from nac_drive.pipeline.drive import udacity_emulator_env, udacity_emulator_episodes, udacity_summary
    from nac_drive.pipeline.explain import intervened_drive
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    torch.manual_seed(0)
    policy = DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                        frame_dt=1 / 15, core=CoreConfig(core="gru", d_model=8, window=4))).eval()
    env = udacity_emulator_env("random-900000")
    try:
        plain = udacity_summary(udacity_emulator_episodes(PolicyDriver(policy), [env], frames=20))
    finally:
        env.close()
    drive = partial(intervened_drive, policy, task="udacity", seeds=[900000], max_steps=20,
                    steering_of=partial(steering_values, None))
    read = drive(None)
    assert {k: v for k, v in read.items() if k not in ("track_steering", "track_offset")} == plain
    assert len(read["track_steering"]) == 1 and abs(read["track_offset"][0]) <= plain["mean_abs_cte_m"][0]
    towards = policy.head[-1].weight[0].detach().numpy()   # the shift the head reads as steering right
    pushed = drive(0.05 * towards / np.linalg.norm(towards))
    assert pushed["track_steering"][0] > read["track_steering"][0]
    assert pushed["track_offset"][0] > read["track_offset"][0]   # steered right, it keeps further right
