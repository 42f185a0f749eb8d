"""``nac-drive explain`` for a steering regression policy (the shipped Udacity one): the
deadband that turns continuous steering into sides and scenes, agreement by side on a
hand-built policy whose one neuron decides the steering, the emulator drive it runs on,
the dashboard's closed-loop panel in metres, and end to end through the CLI."""

import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nac_drive.policy.loading import shipped_policy_path
from nac_drive.interpret.fig4 import SCENES, STEER_DEADBANDS, fig4_claim, scene_classes, sides_of, steering_sides
from nac_drive.interpret.neuron_atlas import PolicyReplay, agreement, neuron_atlas, steering_change
from nac_drive.interpret.trace import load_trace
from nac_drive.pipeline.drive import udacity_emulator_env, udacity_emulator_episodes, udacity_eval_tracks
from nac_drive.pipeline.explain import EXPLAIN_FILE, write_report
from support.steering_policy import one_neuron_steering_policy, record_udacity_run, road_episodes
from support.synthetic_runs import make_synthetic_run

torch.set_num_threads(1)


@dataclasses.dataclass
class _FakeRun:
    policy_action: np.ndarray
    episode: list
    metadata: dict


def _steering_run(steering, names=("steering",), episode=None):
    steering = np.asarray(steering, np.float32)[:, None]
    return _FakeRun(steering, [0] * len(steering) if episode is None else episode, {"action_names": list(names)})


# ------------------------------------------------------------------ sides and scenes
def test_continuous_steering_sides_follow_the_deadband_of_its_column():
    steering = [-0.3, -0.06, -0.04, 0.0, 0.05, 0.07, 0.3]
    assert STEER_DEADBANDS["steering"] == 0.05 and STEER_DEADBANDS["steer"] == 0.1
    assert steering_sides(_steering_run(steering)).tolist() == [-1, -1, 0, 0, 0, 1, 1]            # Udacity: 0.05
    assert steering_sides(_steering_run(steering, ("steer", "gas", "brake"))).tolist() == [-1, 0, 0, 0, 0, 0, 1]
    assert steering_sides(_steering_run(steering), deadband=0.0).tolist() == [-1, -1, -1, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="'steer' or 'steering' column first"):
        steering_sides(_steering_run(steering, ("throttle",)))
    with pytest.raises(ValueError, match="deadband"):
        sides_of(np.zeros(3), -0.1)


def test_scenes_of_a_continuous_steering_trace():
    """Steering within the deadband is straight; a straight step is that side's -straight when
    the last turn of its episode lies within `recent` steps."""
    steering = [-0.2, 0.01, -0.03, 0.02, 0.2, 0.04, 0.0, 0.0, -0.1, 0.03]
    run = _steering_run(steering, episode=[0] * 8 + [1] * 2)
    got = [SCENES[i] for i in scene_classes(run, recent=2)]
    assert got == ["left", "left-straight", "left-straight", "straight", "right", "right-straight", "right-straight",
                   "straight", "left", "left-straight"]
    # CarRacing's deadband of 0.1 on the same values: only +-0.2 turn
    wide = [SCENES[i] for i in scene_classes(run, recent=2, deadband=0.1)]
    assert wide[:5] == ["left", "left-straight", "left-straight", "straight", "right"] and wide[8] == "straight"


def _fig4_steering_run(tmp_path, satisfy: bool):
    """A synthetic trace whose steering (a Udacity 'steering' column) runs in blocks of 10
    steps: left (-0.08), straight (+-0.03, within the deadband), right (+0.08), straight;
    tau and the logits set by the side as Fig. 4 claims, or swapped."""
    run = load_trace(make_synthetic_run(tmp_path / "run", steps=120, with_saliency=False))
    block = np.arange(run.num_steps) // 10 % 4                       # 0 left, 1 straight, 2 right, 3 straight
    steering = np.select([block == 0, block == 2], [-0.08, 0.08], 0.03 * (-1.0) ** np.arange(run.num_steps))
    side = np.select([block == 0, block == 2], [0, 2], 1)
    side = side if satisfy else 2 - side
    valid = run.key_step >= 0
    tau = np.where(valid, np.array([1.0, 1.2, 1.45])[side][:, None, None], np.nan).astype(np.float32)
    logits = np.where(valid, np.array([0.5, 0.62, 0.7])[side][:, None, None], np.nan).astype(np.float32)
    return dataclasses.replace(run, policy_action=steering[:, None].astype(np.float32), tau=tau, logits=logits,
                               phi=logits * tau, metadata={**run.metadata, "action_names": ["steering"]})


@pytest.mark.parametrize("satisfy", [True, False], ids=["as-claimed", "swapped"])
def test_fig4_on_a_continuous_steering_trace(tmp_path, satisfy):
    result = fig4_claim(_fig4_steering_run(tmp_path, satisfy))
    assert result["deadband"] == 0.05
    # 3 cycles of 40 steps; the window (recent) is 8: 8 of each straight block follow the turn before it
    assert result["scenes"] == {"left": 30, "left-straight": 24, "straight": 12, "right-straight": 24, "right": 30}
    expected = "reproduced" if satisfy else "not reproduced"
    assert {c["verdict"] for c in result["claims"].values()} == {expected}
    assert result["heads"][0]["tau"]["auroc_right_vs_left"] == (1.0 if satisfy else 0.0)


# ------------------------------------------------------------------ agreement by side
def test_agreement_by_side_and_the_steering_change_known_answers():
    reference = np.array([-0.3, -0.02, 0.04, 0.2, 0.1])
    steering = np.array([-0.1, 0.03, -0.04, 0.06, -0.2])     # sides kept: left, straight, straight, right; not the last
    assert agreement(steering, reference, deadband=0.05) == 0.8
    assert agreement(steering, reference) == 0.0             # no deadband: equal values only
    assert agreement(steering, reference, deadband=0.0) == 0.4
    assert steering_change(steering, reference) == pytest.approx((0.2 + 0.05 + 0.08 + 0.14 + 0.3) / 5)


def test_the_atlas_of_a_steering_regression_policy(tmp_path):
    """A Udacity policy whose steering is 0.1 v[1]: silencing v[1] holds the steering at 0.1
    times its mean, keeping only the frames on that value's side; nothing else moves it."""
    episodes = road_episodes(episodes=2, steps=30, size=(160, 320))
    policy = one_neuron_steering_policy([f for e in episodes for f in e], unit=1, gain=0.1)
    run = record_udacity_run(policy, episodes, tmp_path / "run")
    sides = steering_sides(run)
    assert {-1, 0, 1} <= set(sides.tolist())                 # left, straight and right steps

    atlas = neuron_atlas(run, policy)
    assert atlas["decision"] == "steering side" and atlas["deadband"] == 0.05
    intact = PolicyReplay(policy, run).actions()              # the steering, replayed from the JPEG frames
    first, rest = atlas["neurons"][0], atlas["neurons"][1:]
    held = 0.1 * first["mean"]                                # v[1] held at its mean over the run
    assert first["name"] == "v[1]" and first["auroc"] == 1.0  # right steps always have the higher v[1]
    assert first["agreement"] == pytest.approx(np.mean(sides_of(intact, 0.05) == sides_of(np.array(held), 0.05)))
    assert first["steering_change"] == pytest.approx(np.mean(np.abs(intact - held)), rel=1e-4)
    assert first["silencing_cost"] > 0.3
    assert max(r["silencing_cost"] for r in rest) == 0.0 and max(r["steering_change"] for r in rest) < 1e-6
    head0, head1 = atlas["heads"]
    # head 0 holds unit 1: its push on the steering output is the steering itself
    assert head0["auroc"] == 1.0 and head0["silencing_cost"] > 0.3
    assert head1["silencing_cost"] == 0.0 and head1["steering_change"] < 1e-6
    assert atlas["uniform_weights"]["agreement"] == 1.0       # one key per query
    assert atlas["frames"] == 60 and atlas["replay_agrees_with_run"] > 0.8
    assert atlas["replay_steering_change"] < 0.01


# ------------------------------------------------------------------ the emulator drive
class _Recorder:
    """An actor that steers ``steering`` and keeps what it was fed."""

    def __init__(self, steering: float, records: bool = True):
        self.steering, self.seen, self.resets, self.records = steering, [], 0, records

    def reset_env(self, env):
        self.env = env

    def reset(self):
        self.resets += 1

    def act(self, obs):
        self.seen.append({k: v for k, v in obs.items() if k != "image"} | {"shape": obs["image"].shape})
        return self.steering


def test_the_emulator_drive_feeds_what_the_bridge_feeds_and_stops_off_the_road():
    assert udacity_eval_tracks(2) == ["random-900000", "random-900001"]
    env = udacity_emulator_env("random-900000")
    try:
        lock = _Recorder(1.0, records=False)                  # full right lock: off the road within seconds
        [result] = udacity_emulator_episodes(lock, [env], frames=400)
        assert result["off_road"] and result["frames"] < 400 and result["max_abs_cte_m"] > 4.0   # half of 8 m
        assert result["track"] == "random-900000" and result["laps"] == 0
        straight = _Recorder(0.0)
        [kept] = udacity_emulator_episodes(straight, [env], frames=30)
    finally:
        env.close()
    assert not kept["off_road"] and kept["frames"] == 30 and kept["mean_abs_cte_m"] < 0.5
    seen = straight.seen
    assert straight.resets == 1 and len(seen) == 30 and seen[0]["shape"] == (160, 320, 3)
    assert [s["timestamp"] for s in seen] == pytest.approx([i / 15 for i in range(30)])
    assert seen[0]["speed"] == 0.0 and 0 < seen[-1]["speed"] < 9.5 and seen[0]["cte"] == 0.0   # the speed controller
    # and the road's scene, which only the emulator in-process knows (m/s, the telemetry's speed is in mph)
    assert all(s["scene"]["cross_track_error"] == s["cte"] for s in seen)
    assert not any("scene" in s for s in lock.seen)   # read only for a driver that records its steps
    assert seen[-1]["scene"]["speed"] == pytest.approx(seen[-1]["speed"] / 2.2369363)


def _small_udacity_policy():
    """An untrained PilotNet+NAC steering policy, small enough to drive a few frames at once."""
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    torch.manual_seed(0)
    return DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                      feature_dim=8, frame_dt=1 / 15,
                                      core=CoreConfig(window=4, d_model=8, num_heads=2, topk=2, backbone_units=6)))


# ------------------------------------------------------------------ the tracks
def test_explains_udacity_tracks_alternate_directions_and_drive_keeps_its_own(tmp_path, monkeypatch):
    """explain drives each held-out loop counter-clockwise, then clockwise (its -cw twin), in its
    traced drive, its closed loop and its push; drive udacity (and compare) keep theirs all
    counter-clockwise."""
    from nac_drive.pipeline import drive as drive_module
    from nac_drive.pipeline.explain import ExplainArgs, _driven, intervened_drive, tracks_driven, udacity_tracks
    from nac_drive.simulators.udacity_track import track_spec

    names = udacity_tracks(5)
    assert names == ["random-900000", "random-900000-cw", "random-900001", "random-900001-cw", "random-900002"]
    assert [track_spec(name).clockwise for name in names] == [False, True, False, True, False]
    assert udacity_tracks(1) == names[:1] and udacity_tracks(2, base=5) == ["random-5", "random-5-cw"]
    assert udacity_eval_tracks(4) == [f"random-{900000 + k}" for k in range(4)]
    closed = tracks_driven("udacity", 3, [900000, 900001, 900002], 900000, 9.0)
    assert closed["track_names"] == names[:3] and closed["seeds"] == [900000, 900000, 900001]   # each track's own

    class Traced(Exception):
        pass

    def traced_drive(policy_path, tracks, *args, **kwargs):
        raise Traced(tracks)

    monkeypatch.setattr(drive_module, "drive_udacity_emulator", traced_drive)
    with pytest.raises(Traced) as traced:
        _driven(ExplainArgs(task="udacity", episodes=3, out=str(tmp_path / "explain")), None,
                SimpleNamespace(task="udacity"), 9.0, progress=False)
    assert traced.value.args[0] == names[:3]
    made, make = [], drive_module.udacity_emulator_env
    monkeypatch.setattr(drive_module, "udacity_emulator_env", lambda name, speed: made.append(name) or make(name, speed))
    figures = intervened_drive(_small_udacity_policy(), None, task="udacity", seeds=[900000, 900001], max_steps=2)
    assert made == names[:2] and figures["lengths"] == [2, 2]   # the closed loop's and the push's drives


# ------------------------------------------------------------------ the road's scene
def test_explain_of_a_small_udacity_policy_reads_the_road_from_the_emulator(tmp_path):
    """In-process, a small untrained PilotNet+NAC policy on one held-out track: the drive records
    the emulator's scene, so the scenes section runs in metres and the probes and their push
    have all four variables."""
    from nac_drive.cli.commands.explain import format_scenes
    from nac_drive.interpret.road_scenes import VARIABLES
    from nac_drive.pipeline.explain import ExplainArgs, explain

    checkpoint = _small_udacity_policy().save_pretrained(tmp_path / "policy")
    report = explain(ExplainArgs(policy=str(checkpoint), episodes=1, max_steps=150, saliency_frames=0,
                                 window_method="none", closed_loop_tracks=0, out=str(tmp_path / "explain")),
                     progress=False)
    steps = report["drive"]["lengths"][0]
    assert steps > 100 and "scenes" not in report["skipped"]
    scenes = report["scenes"]
    assert scenes["task"] == "udacity" and scenes["block_steps"] == 150
    assert scenes["thresholds"] == {"curvature_ahead": 24.0, "length_unit": "m", "curve": 1 / 60, "straight": 1 / 200}
    assert scenes["variables"]["curvature"]["count"] == steps and sum(scenes["classes"].values()) <= steps
    text = format_scenes(scenes)[0]
    assert "curvature over 24 m ahead, 1/m: a curve at |curvature| >= 0.0167 (radius <= 60 m)" in text
    probes = report["probes"]
    assert set(probes["variables"]) == set(VARIABLES) and probes["variables_skipped"] == {}
    assert {row["variable"] for row in probes["scores"]} == set(VARIABLES) and probes["block_steps"] == 150
    push = probes["intervention"]
    assert push is not None and push["probe"]["steps"] == steps
    assert push["steering"] == "steering output (positive right)"
    run = load_trace(tmp_path / "explain")
    assert run.has_scene and np.isfinite(run.curvature).all() and np.isfinite(run.heading_error).all()


def test_a_trace_without_the_scene_loads_and_explain_names_why_it_skips_the_scenes(tmp_path):
    """What the bridge records from the Unity simulator, which sends no cte and no scene."""
    from nac_drive.interpret.road_scenes import road_scenes
    from nac_drive.interpret.trace import SCENE_FIELDS
    from nac_drive.pipeline.explain import NO_SCENE, probes_section, skipped_sections

    episodes = road_episodes(episodes=2, steps=20, size=(160, 320))
    policy = one_neuron_steering_policy([f for e in episodes for f in e])
    run = record_udacity_run(policy, episodes, tmp_path / "run", cte=None)
    assert run.num_steps == 40 and not run.has_scene
    assert all(np.isnan(getattr(run, name)).all() for name in (*SCENE_FIELDS, "cross_track_error"))
    assert skipped_sections("nac", run=run) == {"scenes": NO_SCENE} and "the Unity simulator sends none" in NO_SCENE
    with pytest.raises(ValueError, match="no scene"):
        road_scenes(run, task="udacity")
    probes = probes_section(run, policy)
    assert set(probes["variables_skipped"]) == {"curvature", "cross_track_error", "heading_error", "speed"}
    assert probes["scores"] == [] and probes["intervention"] is None
    assert probes["intervention_skipped"] == "needs the curve ahead: not recorded in this trace"


# ------------------------------------------------------------------ the dashboard
def test_the_dashboard_draws_a_udacity_closed_loop_in_metres(tmp_path):
    from nac_drive.interpret.dashboard import build_dashboard
    from support.dashboard_pages import run_data

    run = load_trace(make_synthetic_run(tmp_path / "run", steps=40, with_saliency=False))
    figures = {"mean_abs_cte": 0.04, "mean_abs_cte_m": [0.04], "off_road_tracks": 0, "laps_finished": 0}
    closed = {"tracks": 1, "seeds": [900000], "track_names": ["random-900000"], "metric": "mean_abs_cte",
              "intact": figures, "neurons": [{"name": "k[3]", "chosen": "top", "silencing_cost": 0.1, **figures,
                                              "mean_abs_cte": 0.09, "cte_change": 0.05}]}
    write_report(tmp_path / "run" / EXPLAIN_FILE, {"task": "udacity", "trace_sha256": run.sha256, "closed_loop": closed})
    panel = run_data(build_dashboard(tmp_path / "run").read_text())["figures"]["explain_closed_loop"]
    assert panel["data"][0]["y"] == [0.05] and panel["layout"]["yaxis"]["title"]["text"] == "mean |cte| change (m)"
    assert "intact: 0.040" in panel["layout"]["title"]["text"]


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_explain_a_udacity_policy_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "explain", "--policy", str(shipped_policy_path("udacity")),
                          "--episodes", "1", "--max-steps", "120", "--frames", "100", "--closed-loop-tracks", "1",
                          "--closed-loop-top", "2", "--closed-loop-random", "1", "--saliency-frames", "4",
                          "--window-method", "ablation", "--out", str(tmp_path / "explain"), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "explain" / EXPLAIN_FILE).read_text())
    assert "emulator tracks (random-900000)" in out.stdout and "|d steering|" in out.stdout
    assert report["task"] == "udacity" and set(report) >= {"run", "policy", "trace_sha256", "drive", "fig4", "atlas",
                                                           "saliency", "window", "mirror", "closed_loop"}
    assert report["mirror"]["decision"] == "steering side" and report["mirror"]["steering_symmetry_error"] >= 0
    assert report["scenes"]["task"] == "udacity" and report["probes"]["intervention"] is not None   # the emulator's road

    drive = report["drive"]
    assert drive["tracks"] == ["random-900000"] and drive["seeds"] == [900000] and drive["lengths"] == [120]
    assert drive["off_road"] == [False] and 0 < drive["mean_abs_cte"] < 0.5 and drive["speed_mph"] == 9.0
    run = load_trace(tmp_path / "explain")
    assert run.num_steps == 120 and report["trace_sha256"] == run.sha256 and run.metadata["action_names"] == ["steering"]
    assert run.metadata["run"]["env"] == "nac_drive/UdacityEmulator-v0" and run.metadata["run"]["tracks"] == ["random-900000"]

    fig4 = report["fig4"]
    assert fig4["deadband"] == 0.05 and sum(fig4["scenes"].values()) == 120 and len(fig4["heads"]) == 4
    atlas = report["atlas"]
    assert atlas["frames"] == 100 and atlas["decision"] == "steering side" and len(atlas["heads"]) == 4
    assert len(atlas["neurons"]) == 3 * 64 + 4 * (8 + 4 + 4)
    costs = [(row["silencing_cost"], row["steering_change"]) for row in atlas["neurons"]]
    assert [c for c, _ in costs] == sorted((c for c, _ in costs), reverse=True)
    assert all(0 <= c <= 1 and d >= 0 for c, d in costs) and atlas["replay_agrees_with_run"] > 0.8
    assert report["saliency"]["frames"] == 4 and report["saliency"]["score"] == "output"
    assert report["window"]["full_window_steps"] == 120 - 15

    closed = report["closed_loop"]
    assert closed["metric"] == "mean_abs_cte" and closed["track_names"] == ["random-900000"]
    assert [n["chosen"] for n in closed["neurons"]] == ["top", "top", "random"]
    assert [n["name"] for n in closed["neurons"][:2]] == [row["name"] for row in atlas["neurons"][:2]]
    intact = closed["intact"]["mean_abs_cte"]
    assert intact == pytest.approx(drive["mean_abs_cte"], rel=0.05)   # the same drive, untraced
    for n in closed["neurons"]:
        assert n["lengths"] == [120] or n["off_road"] == [True]
        assert n["cte_change"] == pytest.approx(n["mean_abs_cte"] - intact)

    from nac_drive.interpret.dashboard import build_dashboard
    from support.dashboard_pages import run_data

    figures = run_data(build_dashboard(tmp_path / "explain").read_text())["figures"]
    assert {"explain_fig4", "explain_atlas", "explain_faithfulness", "explain_closed_loop", "attribution"} <= set(figures)
    assert figures["explain_closed_loop"]["data"][0]["y"] == pytest.approx([n["cte_change"] for n in closed["neurons"]])
    assert figures["explain_closed_loop"]["layout"]["yaxis"]["title"]["text"] == "mean |cte| change (m)"
