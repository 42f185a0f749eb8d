"""Demonstration datasets through Minari's own API: ids, the recovered env (its TimeLimit and
wrappers), the evaluation env, reference scores, shards written by parallel workers."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from nac_drive.cli import main
from nac_drive.data_collection.carracing_dataset import (find_datasets, load_episodes, minari_root, refuse_existing,
                                                         shard_id, write_dataset)
from nac_drive.simulators.carracing import REFERENCE_RETURNS, ActionBursts, make_carracing
from support.demos import synthetic_episodes

torch.set_num_threads(1)
minari = pytest.importorskip("minari")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One plain collection shard and one DAgger shard recorded through random-action bursts."""
    root = tmp_path_factory.mktemp("demos")
    write_dataset(root, "teacher", synthetic_episodes(2, 10), make_carracing(continuous=False), expert="teacher-discrete",
                  description="test")
    bursts = ActionBursts(make_carracing(continuous=False), rate=0.05, burst_frames=7, seed=3)
    write_dataset(root, "dagger", synthetic_episodes(1, 10), bursts, expert="teacher-discrete", description="test")
    return root


def test_ids_are_namespaced_and_versioned_and_minari_loads_them(root):
    with minari_root(root):
        assert sorted(minari.list_local_datasets()) == ["nac_drive/dagger/seeds-100000-100000-v1",
                                                         "nac_drive/teacher/seeds-100000-100001-v1"]
        dataset = minari.load_dataset("nac_drive/teacher/seeds-100000-100001-v1")
    assert dataset.total_episodes == 2
    assert (dataset.spec.namespace, dataset.spec.dataset_name, dataset.spec.version) == (
        "nac_drive/teacher", "seeds-100000-100001", 1)
    metadata = dataset.storage.metadata
    assert metadata["algorithm_name"] == "teacher-discrete" and metadata["author"] == {"nac-drive"}
    assert metadata["code_permalink"].startswith("nac-drive ")
    np.testing.assert_array_equal(next(dataset.iterate_episodes()).observations,
                                  synthetic_episodes(2, 10)[0]["observations"])   # lossless
    import h5py

    with h5py.File(root / "nac_drive/teacher/seeds-100000-100001-v1/data/main_data.hdf5", "r") as f:
        episodes = [f[name] for name in f if isinstance(f[name], h5py.Group)]
        assert len(episodes) == 2 and all(ep["observations"].compression == "gzip" for ep in episodes)
        assert all(ep["actions"].compression is None and dict(ep.attrs) for ep in episodes)   # the rest as Minari wrote it


def test_recovered_envs_are_the_task_and_the_recording_env(root):
    from gymnasium.wrappers import TimeLimit

    with minari_root(root):
        plain = minari.load_dataset("nac_drive/teacher/seeds-100000-100001-v1")
        dagger = minari.load_dataset("nac_drive/dagger/seeds-100000-100000-v1")
    env = plain.recover_environment()
    assert env.spec.max_episode_steps == 1000 and isinstance(env, TimeLimit) and env.unwrapped.continuous is False
    recorded = dagger.recover_environment()           # the bursts the data was recorded through
    assert isinstance(recorded, ActionBursts) and (recorded.rate, recorded.burst_frames, recorded.base_seed) == (
        0.05, 7, 3)
    evaluation = dagger.recover_environment(eval_env=True)   # the held-out task: no bursts
    assert isinstance(evaluation, TimeLimit) and evaluation.spec.additional_wrappers == ()
    assert evaluation.spec.max_episode_steps == 1000


def test_normalized_scores_use_the_measured_random_and_teacher_returns(root):
    with minari_root(root):
        dataset = minari.load_dataset("nac_drive/teacher/seeds-100000-100001-v1")
    random, teacher = np.mean(REFERENCE_RETURNS["random-discrete"]), np.mean(REFERENCE_RETURNS["teacher-discrete"])
    assert random < 0 < 800 < teacher
    scores = minari.get_normalized_score(dataset, np.array([random, teacher, (random + teacher) / 2]))
    np.testing.assert_allclose(scores, [0.0, 1.0, 0.5], atol=1e-9)


def test_a_wrapper_the_spec_cannot_rebuild_and_overlapping_tracks_are_refused(root):
    class Opaque(gym.Wrapper):   # no gymnasium.utils.RecordConstructorArgs
        pass

    with pytest.raises(ValueError, match="Opaque cannot be recreated from env.spec"):
        write_dataset(root, "opaque", synthetic_episodes(1, 10), Opaque(make_carracing(continuous=False)),
                      expert="x", description="")
    with pytest.raises(FileExistsError, match="teacher already holds some of the tracks 100001..100003"):
        refuse_existing(root, "teacher", [100_001, 100_002, 100_003])
    assert refuse_existing(root, "teacher", [100_002]).name == "seeds-100002-100002-v1"
    with pytest.raises(ValueError, match="consecutive"):
        shard_id("teacher", [100_000, 100_002])
    with pytest.raises(ValueError, match="letters, digits"):
        shard_id("../up", [1])


def test_a_stronger_gas_stays_in_the_evaluation_env_and_in_every_episode(root, tmp_path):
    """A DAgger shard of an env whose GAS presses 0.45: the evaluation env drops the bursts
    but keeps DiscreteActions, the episodes say their gas, no references were measured for
    it; a spec whose gas is not a pedal value is refused."""
    import json

    from nac_drive.data_collection.carracing_dataset import DatasetError
    from nac_drive.simulators.carracing import DiscreteActions

    bursts = ActionBursts(DiscreteActions(make_carracing(continuous=True), 0.45), rate=0.05, seed=3)
    with pytest.raises(ValueError, match=r"evaluation env's actions \(continuous, gas\) \(False, 0.2\) are not "
                                         r"the recorded env's \(False, 0.45\)"):
        write_dataset(tmp_path, "gas", synthetic_episodes(1, 10), bursts, expert="x", description="",
                      eval_env=make_carracing())
    path = write_dataset(tmp_path, "gas", synthetic_episodes(1, 10), bursts, expert="x", description="")
    with minari_root(tmp_path):
        dataset = minari.load_dataset("nac_drive/gas/seeds-100000-100000-v1")
    evaluation = dataset.recover_environment(eval_env=True)
    assert isinstance(evaluation, DiscreteActions) and evaluation.gas == 0.45
    assert isinstance(dataset.recover_environment(), ActionBursts)
    assert "ref_min_score" not in dataset.storage.metadata
    assert [e.gas for e in load_episodes(tmp_path)] == [0.45]
    assert {e.gas for e in load_episodes(root)} == {0.2}   # recorded in gymnasium's discrete env

    metadata_file = path / "data" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    for bad in ("-1", '"fast"', "NaN", "true", "1e999"):
        metadata_file.write_text(json.dumps({**metadata, "env_spec": metadata["env_spec"].replace("0.45", bad)}))
        with pytest.raises(DatasetError, match=r"metadata.json: env spec: wrapper DiscreteActions has gas"):
            load_episodes(tmp_path)


@pytest.mark.slow
def test_the_recovered_env_truncates_at_1000_steps(root):
    with minari_root(root):
        env = minari.load_dataset("nac_drive/teacher/seeds-100000-100001-v1").recover_environment()
    env.reset(seed=900_000)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        _, _, terminated, truncated, _ = env.step(0)   # no-op: the car stands still, only the limit ends it
        steps += 1
    assert steps == 1000 and truncated and not terminated


@pytest.mark.slow
def test_the_reference_returns_are_reproducible():
    from nac_drive.agents.experts import load_expert
    from nac_drive.simulators.carracing import run_episodes

    for name in ("random-discrete", "teacher-discrete"):
        actor, continuous = load_expert(name)
        result = run_episodes(actor, [900_000], continuous=continuous)
        assert round(result.returns[0], 2) == pytest.approx(REFERENCE_RETURNS[name][0], abs=0.01), name


@pytest.mark.slow
def test_collect_gas_records_the_teacher_in_that_env_in_every_worker(tmp_path):
    assert main(["collect", "carracing", "--expert", "teacher-discrete", "--gas", "0.4", "--episodes", "2",
                 "--max-steps", "20", "--out", str(tmp_path), "--workers", "2"]) == 0
    episodes = load_episodes(tmp_path)
    assert [(e.seed, e.gas) for e in episodes] == [(100_000, 0.4), (100_001, 0.4)]


def test_a_gas_the_expert_cannot_drive_is_refused_before_collecting(tmp_path, capsys):
    from nac_drive.agents.experts import load_expert
    from nac_drive.agents.ppo_expert import shipped_expert_path

    from nac_drive.simulators.carracing import DISCRETE_GAS, actor_gas

    for spec in ("random-discrete", "teacher-discrete"):   # the env each will be driven in
        assert actor_gas(load_expert(spec, gas=0.4)[0]) == 0.4
        assert actor_gas(load_expert(spec)[0]) == DISCRETE_GAS
    for expert, message in (("teacher", "--gas: teacher drives the continuous env"),
                            (str(shipped_expert_path()), "--gas: ppo:ppo_carracing_discrete's zip sets gas 0.4")):
        assert main(["collect", "carracing", "--expert", expert, "--gas", "0.3", "--episodes", "1",
                     "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    # a dataset name already holding gymnasium's env: more tracks at gas 0.4 would never train with them
    write_dataset(tmp_path, "carracing-teacher-discrete", synthetic_episodes(1, 10), make_carracing(), expert="x",
                  description="")
    assert main(["collect", "carracing", "--expert", "teacher-discrete", "--gas", "0.4", "--seed-base", "100009",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--name: " in err and "seeds-100000-100000-v1 was recorded in an env whose GAS presses 0.2, not 0.4" in err
    assert [e.seed for e in load_episodes(tmp_path)] == [100_000]   # nothing was added


@pytest.mark.slow
def test_two_workers_write_the_episodes_of_one_and_their_shards_combine(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for out, workers in ((one, "1"), (two, "2")):
        assert main(["collect", "carracing", "--expert", "teacher-discrete", "--episodes", "3", "--max-steps", "30",
                     "--seed-base", "100005", "--out", str(out), "--workers", workers]) == 0
    assert sorted(p.name for p in (two / "nac_drive" / "carracing-teacher-discrete").iterdir() if p.is_dir()) == [
        "seeds-100005-100006-v1", "seeds-100007-100007-v1"]
    alone, parallel = load_episodes(one), load_episodes(two)
    assert [e.seed for e in parallel] == [e.seed for e in alone] == [100_005, 100_006, 100_007]
    for a, b in zip(alone, parallel):
        np.testing.assert_array_equal(a.frames, b.frames)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)

    with minari_root(two):
        shards = [minari.load_dataset(i) for i in sorted(minari.list_local_datasets())]
        joined = minari.combine_datasets(shards, "nac_drive/carracing-teacher-discrete-v1")
        assert joined.total_episodes == 3
        assert joined.spec.env_spec.max_episode_steps == 1000
        for episode, original in zip(joined.iterate_episodes(), alone):
            np.testing.assert_array_equal(episode.actions, original.actions)
            np.testing.assert_allclose(episode.rewards, original.rewards, rtol=1e-6)


def test_an_unchanged_dataset_is_read_once_and_a_rewritten_one_again(tmp_path):
    """DAgger's rounds re-train on every dataset: what the previous load read, unchanged,
    is not read again; a new or rewritten shard is."""
    import shutil

    write_dataset(tmp_path, "a", synthetic_episodes(2, 10), make_carracing(), expert="x", description="")
    first = load_episodes(tmp_path)
    write_dataset(tmp_path, "b", synthetic_episodes(1, 12), make_carracing(), expert="y",
                  description="")
    second = load_episodes(tmp_path)
    assert len(second) == 3 and all(a is b for a, b in zip(first, second))   # the same objects: not re-read
    assert [len(e) for e in second] == [10, 10, 12]

    shard = tmp_path / "nac_drive" / "b" / "seeds-100000-100000-v1"
    shutil.rmtree(shard)   # rewritten with other frames
    write_dataset(tmp_path, "b", synthetic_episodes(1, 7), make_carracing(), expert="y",
                  description="")
    third = load_episodes(tmp_path)
    assert [len(e) for e in third] == [10, 10, 7]
    assert third[0] is first[0] and third[2] is not second[2]


def test_claims_of_tracks_refuse_live_overlaps_and_ignore_stale_ones(tmp_path):
    """A live claim on some of the tracks refuses a second one; a claim whose process is
    gone, or whose id a later process reuses (another start time), is stale: removed."""
    import os
    import subprocess
    import sys

    from nac_drive.data_collection.carracing_dataset import claim_tracks, dataset_folder

    folder = dataset_folder(tmp_path, "d")
    with claim_tracks(tmp_path, "d", range(100_000, 100_010)) as mine:
        assert mine.name == f".claim.seeds-100000-100009.{os.getpid()}" and mine.is_file()
        with pytest.raises(FileExistsError, match=rf"another collect \(pid {os.getpid()}\) is recording tracks "
                                                  r"100000\.\.100009 of dataset d, some of 100009\.\.100012"):
            with claim_tracks(tmp_path, "d", range(100_009, 100_013)):
                pass
        with claim_tracks(tmp_path, "d", range(100_010, 100_013)):   # the next tracks: no overlap
            assert len(list(folder.glob(".claim.*"))) == 2
    assert list(folder.glob(".claim.*")) == []
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = folder / f".claim.seeds-100000-100009.{int(gone.stdout)}"
    dead.write_text("1\n")
    reused = folder / f".claim.seeds-100005-100005.{os.getpid()}"
    reused.write_text("0\n")   # this process's id, another start time: a previous owner of the id
    with claim_tracks(tmp_path, "d", range(100_000, 100_010)):
        assert not dead.exists() and not reused.exists()


def test_shards_of_one_dataset_that_share_tracks_are_refused_when_loaded(tmp_path):
    """Shards copied together from runs with overlapping seeds would give load_episodes
    the shared tracks twice (in training and validation at once): refused, naming both."""
    import shutil

    from nac_drive.data_collection.carracing_dataset import DatasetError

    a = write_dataset(tmp_path / "a", "d", synthetic_episodes(3, 8), "CarRacing-v3", expert="x", description="")
    later = synthetic_episodes(2, 8)
    for episode, seed in zip(later, (100_002, 100_003)):
        episode["seed"] = seed
    b = write_dataset(tmp_path / "b", "d", later, "CarRacing-v3", expert="x", description="")
    assert [ep.seed for ep in load_episodes(tmp_path)] == [100_000, 100_001, 100_002, 100_002, 100_003]  # two datasets
    shutil.copytree(b, a.parent / b.name)
    with pytest.raises(DatasetError, match=r"seeds-100002-100003-v1: holds tracks of seeds-100000-100002-v1 as well"):
        load_episodes(tmp_path / "a")


def test_a_dataset_linked_in_from_elsewhere_is_found_once_and_a_link_loop_ends(tmp_path):
    # once: a symlinked dataset under --data was skipped silently (Path.rglob does not follow links)
    elsewhere, data = tmp_path / "elsewhere", tmp_path / "data"
    shard = write_dataset(elsewhere, "far", synthetic_episodes(2, 8), "CarRacing-v3", expert="x", description="")
    data.mkdir()
    (data / "linked").symlink_to(elsewhere)
    (data / "again").symlink_to(elsewhere)      # the same real folder twice: its episodes once
    (data / "loop").symlink_to(data)            # a link back up
    assert find_datasets(data) == [data / "again" / shard.relative_to(elsewhere)]
    assert len(load_episodes(data)) == 2
