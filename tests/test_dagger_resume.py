"""nac-drive dagger --resume: which rounds a killed run keeps, and what it refuses to touch."""

import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from nac_drive.data_collection.carracing_dataset import Episode, shard_id
from nac_drive.pipeline.dagger import (DaggerArgs, _resumable, lap_finished, record_rounds, recorded,
                                       refuse_other_rounds, round_seeds)
from nac_drive.pipeline.train_args import TrainArgs


def round_folder(tmp_path, args: TrainArgs, epoch: int | None) -> TrainArgs:
    """A round's run folder as ``train`` leaves it: its arguments, and a ``last/`` after ``epoch`` (None: none)."""
    run = tmp_path / args.run_name
    run.mkdir(parents=True)
    (run / "train_args.json").write_text(json.dumps({**asdict(args), "world_size": 1}))
    if epoch is not None:
        (run / "last").mkdir()
        (run / "last" / "train_state.json").write_text(json.dumps({"epoch": epoch, "best_val_loss": 0.5}))
    return args


def test_a_round_goes_on_only_in_its_own_folder_with_its_own_arguments(tmp_path):
    args = TrainArgs(data=str(tmp_path / "data"), out=str(tmp_path), run_name="dagger-r0", epochs=3,
                     init_from=str(tmp_path / "bc" / "best"))
    round_folder(tmp_path, args, epoch=0)
    assert _resumable(args, kept=True) == (True, False)             # one epoch of 3: it goes on
    assert _resumable(replace(args, progress=False), kept=True) == (True, False)   # what may change
    with pytest.raises(ValueError, match=r"dagger-r0 was fine-tuned with other epochs, lr; resume with"):
        _resumable(replace(args, epochs=5, lr=2e-4), kept=True)
    with pytest.raises(ValueError, match="holds a checkpoint, but its round's dataset is not in --data"):
        _resumable(args, kept=False)                                # another run's: never removed
    assert (tmp_path / "dagger-r0" / "last").is_dir()

    whole = round_folder(tmp_path, replace(args, run_name="dagger-r1"), epoch=2)
    assert _resumable(whole, kept=True) == (True, True)             # every epoch trained: not trained again
    early = round_folder(tmp_path, replace(args, run_name="dagger-r2"), epoch=None)
    assert _resumable(early, kept=False) == (False, False) and not (tmp_path / "dagger-r2").exists()


def test_a_recorded_episode_finished_its_lap_only_if_it_did_not_leave_the_playfield():
    def episode(last_reward: float, terminated: bool) -> Episode:
        rewards = np.array([3.0, -0.1, last_reward], np.float32)
        return Episode(np.zeros((3, 96, 96, 3), np.uint8), np.zeros(3, np.int64), rewards, np.arange(3.0), 1, "x",
                       "test", terminated=terminated)

    assert lap_finished(episode(6.9, terminated=True))
    assert not lap_finished(episode(-100.0, terminated=True))       # off the playfield
    assert not lap_finished(episode(6.9, terminated=False))         # the time limit


def test_a_round_is_recorded_however_many_workers_split_its_shards(tmp_path):
    seeds = round_seeds(0, 0, 4)
    for run in (seeds[:2], seeds[2:]):   # written by two workers; resumed with one, or three
        (tmp_path / shard_id("dagger-r0-s0", run)).mkdir(parents=True)
    assert recorded(tmp_path, "dagger-r0-s0", seeds)
    assert not recorded(tmp_path, "dagger-r0-s0", round_seeds(0, 0, 5))   # a fifth episode never driven
    assert not recorded(tmp_path, "dagger-r1-s0", round_seeds(1, 0, 4))


def test_resume_keeps_rounds_only_driven_with_the_same_flags(tmp_path):
    args = DaggerArgs(policy=str(tmp_path / "bc" / "best"), disturb_rate=0.02)
    fine_tune = TrainArgs(data=str(tmp_path / "data"), out=str(tmp_path / "out"), run_name="dagger", seed=1)
    record_rounds(args, fine_tune)
    assert json.loads((tmp_path / "out" / "dagger.json").read_text())["disturb_rate"] == 0.02
    refuse_other_rounds(replace(args, resume=True, workers=1, rounds=6), fine_tune)   # how it runs, how many rounds
    with pytest.raises(ValueError, match=r"were driven with other disturb_rate, oracle \("):
        refuse_other_rounds(replace(args, disturb_rate=0.05, oracle="planner"), fine_tune)
    with pytest.raises(ValueError, match="driven with other seed"):
        refuse_other_rounds(args, replace(fine_tune, seed=2))
