"""CarRacing end to end at tiny scale: collect -> train -> drive, through the CLI."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from nac_drive.data_collection.carracing_dataset import WindowDataset, load_episodes
from nac_drive.interpret.trace import load_trace
from nac_drive.policy.driving_policy import DrivingPolicy

torch.set_num_threads(1)


def cli(*args, timeout=900):
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", *args], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"nac-drive {' '.join(args)} failed:\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.slow
def test_collect_train_drive(tmp_path):
    demos, train_dir, run = tmp_path / "demos", tmp_path / "train", tmp_path / "run"
    cli("collect", "carracing", "--expert", "teacher-discrete", "--episodes", "2", "--max-steps", "150",
        "--seed-base", "100007", "--out", str(demos))
    episodes = load_episodes(demos)
    assert [len(e) for e in episodes] == [150, 150]
    assert [e.seed for e in episodes] == [100_007, 100_008] and episodes[0].expert == "teacher-discrete"
    assert episodes[0].frames.shape == (150, 96, 96, 3) and episodes[0].actions.dtype == np.int64

    cli("train", "--data", str(demos), "--out", str(train_dir), "--run-name", "tiny", "--window", "8",
        "--epochs", "8", "--windows-per-epoch", "256", "--batch-size", "16", "--class-weighting", "none",
        "--val-fraction", "0", "--lr", "3e-3", "--no-progress")
    best = train_dir / "tiny" / "best"
    assert {p.name for p in best.iterdir()} == {"README.md", "config.json", "model.safetensors"}

    # The trained policy beats the best constant-action policy on its training data:
    # its cross-entropy is below the entropy of the action frequencies.
    policy = DrivingPolicy.from_pretrained(best)
    windows = WindowDataset(episodes, window=8)
    frames, stamps, actions = zip(*(windows[i] for i in range(0, len(windows), 4)))
    with torch.no_grad():
        logits = policy(torch.stack(frames), torch.stack(stamps))
    actions = torch.stack(actions)
    policy_ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), actions.flatten()).item()
    freq = np.bincount(actions.flatten().numpy(), minlength=5) / actions.numel()
    constant_ce = -(freq[freq > 0] * np.log(freq[freq > 0])).sum()
    assert policy_ce < 0.8 * constant_ce, (policy_ce, constant_ce)

    out = cli("drive", "carracing", "--policy", str(best), "--episodes", "1", "--max-steps", "60",
              "--trace", str(run), "--json")
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["episodes"] == 1 and summary["seeds"] == [900_000] and summary["lengths"] == [60]
    for key in ("mean_return", "std_return", "laps_finished", "latency_ms_p50"):
        assert key in summary
    trace = load_trace(run)
    assert trace.num_steps == 60 and trace.q.shape == (60, policy.config.core.d_model)
    assert np.isfinite(trace.expert_action).all()     # the teacher labelled every frame

    # One DAgger round: the student drives, the teacher labels, the student is fine-tuned.
    out = cli("dagger", "--policy", str(best), "--data", str(demos), "--out", str(train_dir), "--run-name", "dg",
              "--rounds", "1", "--episodes", "1", "--max-steps", "40", "--disturb-rate", "0.05",
              "--window", "8", "--epochs", "1",
              "--windows-per-epoch", "64", "--batch-size", "16", "--val-fraction", "0", "--no-progress")
    final = train_dir / "dg-r0" / "best"
    assert f"final checkpoint: {final}" in out
    assert "DAgger round 0: the student drove (with random-action bursts)" in out
    labelled = [e for e in load_episodes(demos) if e.source.count("dagger-r0-s0")]
    assert len(labelled) == 1 and len(labelled[0]) == 40 and labelled[0].expert == "teacher-discrete"
    assert labelled[0].seed == 150_000                                 # collection range, never evaluation
    tuned = DrivingPolicy.from_pretrained(final)
    assert not torch.equal(tuned.head[1].weight, policy.head[1].weight)

    # TensorBoard: the round's run shows how the student it started from drove (closed_loop/)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(train_dir / "dg-r0" / "tensorboard"))
    events.Reload()
    (drove,) = events.Scalars("closed_loop/mean_return")
    assert drove.value == pytest.approx(labelled[0].total_reward, abs=1e-3)


@pytest.mark.slow
def test_a_dagger_round_driven_in_two_processes_records_what_one_process_does(tmp_path):
    """Each process drives a run of the round's tracks and writes it as one shard; the
    random-action bursts of a track do not depend on how the round was split."""
    from nac_drive.policy.loading import shipped_policy_path
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.pipeline.train_args import TrainArgs

    recorded = {}
    for workers in (1, 2):
        data = tmp_path / f"workers{workers}"
        tiny = TrainArgs(data=str(data), out=str(tmp_path / f"train{workers}"), window=8, epochs=1,
                         windows_per_epoch=16, batch_size=16, val_fraction=0, progress=False)
        dagger(DaggerArgs(policy=str(shipped_policy_path()), rounds=1, episodes=3, max_steps=40, disturb_rate=0.1,
                          disturb_frames=5, oracle="teacher", workers=workers), tiny)
        shards = sorted(p.name for p in (data / "nac_drive" / "dagger-r0-s0").iterdir() if p.is_dir())
        recorded[workers] = shards, load_episodes(data)
    assert recorded[1][0] == ["seeds-150000-150002-v1"]
    assert recorded[2][0] == ["seeds-150000-150001-v1", "seeds-150002-150002-v1"]
    alone, split = recorded[1][1], recorded[2][1]
    assert [e.seed for e in split] == [e.seed for e in alone] == [150_000, 150_001, 150_002]
    for a, b in zip(alone, split):
        np.testing.assert_array_equal(a.frames, b.frames)
        np.testing.assert_array_equal(a.actions, b.actions)
    # the bursts took the car somewhere the undisturbed student does not go: they were on
    undisturbed = tmp_path / "undisturbed"
    dagger(DaggerArgs(policy=str(shipped_policy_path()), rounds=1, episodes=1, max_steps=40, oracle="teacher",
                      workers=1), dataclasses.replace(tiny, data=str(undisturbed)))
    assert not np.array_equal(load_episodes(undisturbed)[0].frames, alone[0].frames)


@pytest.mark.slow
def test_a_stronger_gas_runs_through_demonstrations_policy_driving_and_dagger(tmp_path):
    """An expert zip whose GAS presses 0.5 records its demonstrations in that env (the
    dataset's env spec keeps it); the policy trained on them learns that env, drives only
    there, and its DAgger round is labelled there. Datasets of two envs are refused."""
    from minari import MinariDataset
    from support.expert_zips import shipped_with_data

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.agents.ppo_lab.expert_zip import read_data
    from nac_drive.agents.ppo_expert import PPOExpert, shipped_expert_path
    from nac_drive.data_collection.carracing_dataset import find_datasets
    from nac_drive.pipeline.collect import CollectArgs, collect_carracing
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.train_args import TrainArgs
    from nac_drive.simulators.carracing import make_carracing, run_episodes

    record = read_data(shipped_expert_path())["preprocessing"]
    expert = shipped_with_data(tmp_path / "gas.zip", preprocessing={**record, "gas": 0.5})
    demos, train_dir = tmp_path / "demos", tmp_path / "train"
    cli("collect", "carracing", "--expert", str(expert), "--episodes", "1", "--max-steps", "80", "--out", str(demos))
    (episode,) = load_episodes(demos)
    assert episode.gas == 0.5
    alone = run_episodes(PPOExpert(expert), [episode.seed], max_steps=80)   # the expert, in its own env
    assert episode.total_reward == pytest.approx(alone.returns[0], abs=1e-3)
    dataset = MinariDataset(find_datasets(demos)[0] / "data")
    evaluation = dataset.recover_environment(eval_env=True)
    assert evaluation.get_wrapper_attr("gas") == 0.5
    assert "ref_min_score" not in dataset.storage.metadata   # no references measured at gas 0.5

    cli("train", "--data", str(demos), "--out", str(train_dir), "--run-name", "gas", "--window", "8",
        "--epochs", "1", "--windows-per-epoch", "32", "--batch-size", "16", "--val-fraction", "0", "--no-progress")
    best = train_dir / "gas" / "best"
    policy = DrivingPolicy.from_pretrained(best)
    assert policy.config.gas == 0.5
    with pytest.raises(ValueError, match="the env's GAS presses 0.2, this policy learned 0.5"):
        PolicyDriver(policy).reset_env(make_carracing())   # what `drive` would meet in the stock env
    summary = json.loads(cli("drive", "carracing", "--policy", str(best), "--episodes", "1", "--max-steps", "30",
                             "--json").strip().splitlines()[-1])
    assert summary["lengths"] == [30]

    cli("dagger", "--policy", str(best), "--data", str(demos), "--out", str(train_dir), "--run-name", "dg",
        "--oracle", str(expert), "--rounds", "1", "--episodes", "1", "--max-steps", "30", "--window", "8",
        "--epochs", "1", "--windows-per-epoch", "16", "--batch-size", "16", "--val-fraction", "0", "--no-progress")
    labelled = [e for e in load_episodes(demos) if "dagger-r0-s0" in e.source]
    assert [(len(e), e.gas, e.expert) for e in labelled] == [(30, 0.5, "ppo:gas")]
    assert DrivingPolicy.from_pretrained(train_dir / "dg-r0" / "best").config.gas == 0.5

    # gymnasium's env: a policy of gas 0.5 neither fine-tunes on its data nor joins it in DAgger
    stock = tmp_path / "stock"
    collect_carracing(CollectArgs(expert="teacher-discrete", episodes=1, seed_base=100_005, out=str(stock), max_steps=20),
                      progress=False)
    tiny = dict(out=str(train_dir), window=8, epochs=1, windows_per_epoch=16, batch_size=16, val_fraction=0,
                progress=False)
    with pytest.raises(ValueError, match="learned an env whose GAS presses 0.5, the data was recorded with 0.2"):
        train(TrainArgs(data=str(stock), init_from=str(best), **tiny))
    with pytest.raises(ValueError, match=r"--data: .*seeds-100005-100005-v1 was recorded in an env whose GAS "
                                         r"presses 0.2, not 0.5"):
        dagger(DaggerArgs(policy=str(best), rounds=1, episodes=1), TrainArgs(data=str(stock), seed=1, **tiny))
    assert {e.seed for e in load_episodes(stock)} == {100_005}   # refused before any round was driven
    collect_carracing(CollectArgs(expert="teacher-discrete", episodes=1, seed_base=100_005, out=str(demos), max_steps=20),
                      progress=False)
    with pytest.raises(ValueError, match=r"GAS presses \[0.2, 0.5\] \(e.g. .*seeds-100005-100005-v1.*: 0.2, "
                                         r".*: 0.5\)"):
        train(TrainArgs(data=str(demos), **tiny))


@pytest.mark.slow
def test_quickstart_full_makes_a_policy_from_the_ppo_expert_and_scores_both(tmp_path):
    """``quickstart --full``: the PPO expert demonstrates, behaviour cloning, one DAgger round
    in which the PPO expert labels the student, then the last round's checkpoint drives two
    tracks (the first recorded) and the expert is scored on the same two (every episode
    capped at 60 frames)."""
    out = cli("quickstart", "--full", "--budget", "small", "--collect-episodes", "1", "--epochs", "1",
              "--windows-per-epoch", "32", "--dagger-rounds", "1", "--episodes", "2", "--recorded", "1",
              "--max-steps", "60", "--no-saliency", "--out", str(tmp_path / "qs"), "--json")
    summary = json.loads(out.strip().splitlines()[-1])
    qs = tmp_path / "qs"
    assert summary["policy"] == str(qs / "train" / "dagger-r0" / "best")      # DAgger's, not behaviour cloning's
    assert list(summary["stage_seconds"]) == ["collect", "train", "dagger", "drive", "expert", "dashboard"]
    assert summary["seconds"] >= sum(summary["stage_seconds"].values()) - 1

    episodes = load_episodes(qs / "demos")
    demos = [e for e in episodes if "quickstart-s0" in e.source]
    labelled = [e for e in episodes if "dagger-r0-s0" in e.source]
    assert [len(e) for e in demos] == [60] and [len(e) for e in labelled] == [60, 60]   # small budget: 2 episodes
    assert {e.expert for e in demos} == {e.expert for e in labelled} == {summary["expert"]["name"]}
    assert summary["expert"]["name"].startswith("ppo")

    expert = summary["expert"]
    assert expert["seeds"] == summary["seeds"] == [900_000, 900_001]
    assert expert["lengths"] == summary["lengths"] == [60, 60]
    if expert["mean_return"] > 0:
        assert summary["share_of_expert"] == pytest.approx(summary["mean_return"] / expert["mean_return"], abs=1e-4)
    else:   # no share of a return <= 0 (valid JSON: null, never NaN)
        assert summary["share_of_expert"] is None
    assert (qs / "dashboard.html").stat().st_size > 0 and (qs / "drive.webm").stat().st_size > 0
    trace = load_trace(qs / "run")   # the first track only: the second was scored, not recorded
    assert trace.num_steps == 60 and set(trace.episode.tolist()) == {0}


def test_quickstart_budgets_give_way_to_explicit_sizes():
    from nac_drive.pipeline.quickstart import BUDGETS, TRACKS, QuickstartArgs

    assert QuickstartArgs(full=True).stages() == BUDGETS["standard"]
    # tracks driven: the budget's with --full (more than the shipped policy's quick look), or as given
    assert QuickstartArgs().tracks() == TRACKS < QuickstartArgs(full=True).tracks() == BUDGETS["standard"].episodes
    assert QuickstartArgs(episodes=5).tracks() == QuickstartArgs(full=True, episodes=5).tracks() == 5
    small = QuickstartArgs(full=True, budget="small", epochs=7, dagger_rounds=0).stages()
    assert small.epochs == 7 and small.dagger_rounds == 0
    assert small.collect_episodes == BUDGETS["small"].collect_episodes < BUDGETS["standard"].collect_episodes
    with pytest.raises(ValueError, match="--budget"):
        QuickstartArgs(full=True, budget="huge")
    with pytest.raises(ValueError, match="--dagger-rounds: only with --full"):   # it would do nothing
        QuickstartArgs(dagger_rounds=3)
