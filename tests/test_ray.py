"""--ray [ADDRESS]: collect's, compare's, tune's, dagger's and explain's jobs as Ray tasks give what
this machine's processes (or one process) give; a task whose worker dies runs again and is counted;
nothing phones home; no Ray without --ray."""

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nac_drive.cli.main import main
from nac_drive.data_collection.carracing_dataset import load_episodes, write_dataset
from nac_drive.pipeline.ray_tasks import EXTRA_HINT, LOCAL, ray_jobs, tasks_on_ray
from nac_drive.torch_threads import available_cores
from support.demos import synthetic_episodes

TINY = ["--window", "4", "--d-model", "16", "--epochs", "1", "--windows-per-epoch", "32", "--no-progress"]
two_cores = pytest.mark.skipif(available_cores() < 2, reason="the process pool's side needs --workers 2")


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each on this machine."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"   # the nodes this test starts report nothing either
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes.address
    nodes.shutdown()


def episode_hashes(root: Path) -> list[tuple]:
    """Each episode's track, and hashes of its frames and actions, in track order."""
    return [(e.seed, hashlib.sha256(e.frames.tobytes()).hexdigest(), hashlib.sha256(e.actions.tobytes()).hexdigest())
            for e in load_episodes(root)]


@two_cores
@pytest.mark.slow
def test_collect_on_a_two_node_ray_writes_the_shards_of_the_process_pool(cluster, tmp_path, capsys):
    common = ["collect", "carracing", "--expert", "teacher-discrete", "--episodes", "3", "--max-steps", "25",
              "--workers", "2"]
    assert main([*common, "--out", str(tmp_path / "pool")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster]) == 0
    assert "ray: 2 tasks on 2 nodes, none retried" in capsys.readouterr().err
    shards = [sorted(p.name for p in (tmp_path / side / "nac_drive" / "carracing-teacher-discrete").iterdir()
                     if p.is_dir()) for side in ("pool", "ray")]
    assert shards[0] == shards[1] == ["seeds-100000-100001-v1", "seeds-100002-100002-v1"]
    pool, ray_side = episode_hashes(tmp_path / "pool"), episode_hashes(tmp_path / "ray")
    assert [seed for seed, *_ in pool] == [100000, 100001, 100002]
    assert ray_side == pool
    assert not list((tmp_path / "ray").glob(".*.partial"))   # nothing left staged


@two_cores
@pytest.mark.slow
def test_compare_on_a_two_node_ray_gives_the_table_of_the_process_pool(cluster, tmp_path, capsys):
    write_dataset(tmp_path / "demos", "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands",
                  description="test")
    common = ["compare", "--data", str(tmp_path / "demos"), "--variants", "lstm", "nac-exact", "--seeds", "0",
              "--episodes", "1", "--max-steps", "10", *TINY]
    assert main([*common, "--out", str(tmp_path / "pool"), "--workers", "2"]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster]) == 0
    assert "ray: 2 tasks on 2 nodes, none retried" in capsys.readouterr().err
    pool, ray_side = (json.loads((tmp_path / side / "compare.json").read_text()) for side in ("pool", "ray"))
    for side, report in (("pool", pool), ("ray", ray_side)):
        for row in report["variants"]:   # each side's runs in its own folder, named alike
            assert row.pop("runs") == [str(tmp_path / side / "runs" / f"{row['variant']}__s0")]
    assert ray_side == pool
    assert ray_side["variants"][0]["closed_loop"]["episodes"] == 1
    assert sorted(p.name for p in (tmp_path / "ray" / "results").iterdir()) == ["lstm__s0.json", "nac-exact__s0.json"]
    # --workers says how many run at once in a pool: with --ray the cluster does
    assert main([*common, "--out", str(tmp_path / "again"), "--ray", cluster, "--workers", "2"]) == 2
    assert "--workers" in capsys.readouterr().err


@two_cores
@pytest.mark.slow
def test_dagger_on_a_two_node_ray_records_and_fine_tunes_as_the_process_pool(cluster, tmp_path, capsys):
    """Each round's runs of tracks as Ray tasks (one Ray session for both rounds): the same shards,
    episodes and labels as the worker processes record, so the same fine-tuned weights."""
    from safetensors.torch import load_file

    from nac_drive.policy.loading import shipped_policy_path

    common = ["dagger", "--policy", str(shipped_policy_path()), "--rounds", "2", "--episodes", "3", "--max-steps", "20",
              "--workers", "2", "--disturb-rate", "0.1", "--disturb-frames", "5", "--window", "8", "--epochs", "1",
              "--windows-per-epoch", "16", "--batch-size", "16", "--val-fraction", "0", "--no-progress"]
    for side, ray in (("pool", []), ("ray", ["--ray", cluster])):
        assert main([*common, "--data", str(tmp_path / side / "data"), "--out", str(tmp_path / side / "runs"),
                     *ray]) == 0
    assert "ray: 4 tasks on 2 nodes, none retried" in capsys.readouterr().err
    for r in (0, 1):
        shards = [sorted(p.name for p in (tmp_path / side / "data" / "nac_drive" / f"dagger-r{r}-s0").iterdir()
                         if p.is_dir()) for side in ("pool", "ray")]
        assert shards[0] == shards[1] and len(shards[0]) == 2
    pool, ray_side = episode_hashes(tmp_path / "pool" / "data"), episode_hashes(tmp_path / "ray" / "data")
    assert len(pool) == 6 and ray_side == pool
    weights = [load_file(tmp_path / side / "runs" / "dagger-r1" / "best" / "model.safetensors")
               for side in ("pool", "ray")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@two_cores
@pytest.mark.slow
def test_tune_on_a_two_node_ray_draws_and_scores_the_trials_of_the_process_pool(cluster, tmp_path, capsys):
    """Trials asked two at a time, trained and driven as Ray tasks (both batches in one Ray
    session): the same values drawn and the same scores as in worker processes; only this
    process writes the study."""
    import optuna

    write_dataset(tmp_path / "demos", "synthetic", synthetic_episodes(), "CarRacing-v3", expert="bands",
                  description="test")
    common = ["tune", "--data", str(tmp_path / "demos"), "--variant", "gru", "--trials", "3", "--workers", "2",
              "--episodes", "1", "--max-steps", "10", "--window", "4", "--epochs", "1", "--windows-per-epoch", "32",
              "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "pool")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster]) == 0
    assert "ray: 3 tasks on 2 nodes, none retried" in capsys.readouterr().err
    trials = {}
    for side in ("pool", "ray"):
        study = optuna.load_study(study_name="gru", storage=f"sqlite:///{tmp_path / side / 'gru' / 'study.db'}")
        trials[side] = [(t.number, t.state, t.params, t.user_attrs["value"], t.user_attrs["seeds"]) for t in study.trials]
    assert [state for _, state, *_ in trials["pool"]] == [optuna.trial.TrialState.COMPLETE] * 3
    assert trials["ray"] == trials["pool"]
    assert len({str(params) for _, _, params, *_ in trials["pool"]}) == 3   # three draws, not one thrice
    best = [json.loads((tmp_path / side / "gru" / "best.json").read_text()) for side in ("pool", "ray")]
    assert best[0] == best[1]
    assert sorted(p.name for p in (tmp_path / "ray" / "gru" / "runs").iterdir()) == ["trial-0", "trial-1", "trial-2"]


@pytest.mark.slow
def test_explains_closed_loop_on_a_two_node_ray_gives_the_figures_of_one_process(cluster, tmp_path, capsys):
    """Each closed-loop drive (intact, each neuron clamped, each attention part replaced) as a Ray
    task that loads the policy itself: the same returns, changes and intervals as in-process."""
    from nac_drive.pipeline.explain import PUSH_RANDOM

    common = ["explain", "--episodes", "1", "--max-steps", "80", "--frames", "80", "--saliency-frames", "0",
              "--window-method", "none", "--closed-loop-tracks", "2", "--closed-loop-top", "1",
              "--closed-loop-random", "1"]
    assert main([*common, "--out", str(tmp_path / "here")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", cluster]) == 0
    assert json.loads((tmp_path / "ray" / "explain.json").read_text())["push"] is not None   # it drove too
    # one Ray session for both sections that drive: the closed loop's 1 intact + 2 neurons + 4 parts, and the push's
    # 2 curves + the random directions (its intact drive is the closed loop's)
    assert re.findall(r"ray: .*", capsys.readouterr().err) == [f"ray: {7 + 2 + PUSH_RANDOM} tasks on 2 nodes, none retried"]
    here, ray_side = (json.loads((tmp_path / side / "explain.json").read_text())["closed_loop"]
                      for side in ("here", "ray"))
    assert len(here["intact"]["returns"]) == 2 and len(here["neurons"]) == 2 and len(here["attention"]) == 4
    assert ray_side == here


@pytest.mark.slow
def test_the_push_on_a_two_node_ray_gives_the_figures_of_one_process(cluster, tmp_path, capsys):
    """Each drive of the push (intact, towards a left and a right curve, the random directions)
    as a Ray task that loads the policy itself and shifts its core's output: the same returns,
    steering and intervals as in-process."""
    from nac_drive.pipeline.explain import PUSH_RANDOM, push_section
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.simulators.carracing import ACTION_NAMES
    from support.curve_runs import curve_run

    torch.manual_seed(0)
    torch.set_num_threads(1)   # as a Ray task runs
    saved = str(DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4))).save_pretrained(
        tmp_path / "gru"))
    run = curve_run(tmp_path / "run", action_names=ACTION_NAMES)
    probes = {"intervention": {"verdict": "-"}}   # all the push asks of probes_section: it pushed open loop
    here = push_section(run, load_driving_policy(saved), probes, tracks=2, max_steps=20, policy_path=saved)
    with ray_jobs(cluster) as jobs:
        ray_side = push_section(run, load_driving_policy(saved), probes, tracks=2, max_steps=20, jobs=jobs,
                                policy_path=saved)
    assert f"ray: {1 + 2 + PUSH_RANDOM} tasks on 2 nodes, none retried" in capsys.readouterr().err
    assert len(here["intact"]["track_steering"]) == 2 and len(here["pushes"]) == 2 + PUSH_RANDOM
    assert ray_side == here


def test_a_task_whose_worker_dies_runs_again_and_is_counted(tmp_path, capfd):
    pytest.importorskip("ray")
    marker = tmp_path / "died-once"

    def die_once(job):
        import os

        if job == 1 and not marker.exists():
            marker.touch()
            os._exit(1)   # the worker process dies, as on a lost node
        return job

    assert sorted(tasks_on_ray(die_once, [0, 1, 2], LOCAL)) == [(0, 0), (1, 1), (2, 2)]
    assert marker.exists()
    assert "ray: 3 tasks on 1 node, 1 retried after its worker died (1 retries)" in capfd.readouterr().err


def test_a_local_ray_reports_nothing_and_listens_on_the_loopback():
    pytest.importorskip("ray")
    # a fresh process, as the CLI runs: Ray is imported only by --ray, with usage statistics unset
    script = ("import os\n"
              "from nac_drive.pipeline.ray_tasks import LOCAL, tasks_on_ray\n"
              "def seen(job):\n"
              "    import os, ray\n"
              "    return os.environ.get('RAY_USAGE_STATS_ENABLED'), ray.util.get_node_ip_address()\n"
              "print(list(tasks_on_ray(seen, [0], LOCAL)))\n"
              "from ray._common.usage.usage_lib import usage_stats_enabled\n"
              "print(usage_stats_enabled())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    *_, tasks, enabled = done.stdout.strip().splitlines()
    assert ast.literal_eval(tasks) == [(0, ("0", "127.0.0.1"))]   # the worker saw them off too
    assert enabled == "False"


def test_rounds_in_one_ray_session_keep_their_order_and_are_counted_together(capfd):
    pytest.importorskip("ray")
    with ray_jobs(LOCAL) as jobs:
        assert dict(jobs.run(lambda job: 10 * job, [3, 1, 2])) == {0: 30, 1: 10, 2: 20}   # by each job's index
        assert dict(jobs.run(lambda job: -job, [5])) == {0: -5}
    assert "ray: 4 tasks on 1 node, none retried" in capfd.readouterr().err   # one line for the session
    with ray_jobs(None) as none:   # no address: nothing started, the verb runs its jobs here
        assert none is None


def test_flags_ray_would_not_use_or_workers_beyond_the_cores_are_refused_in_one_line(tmp_path, capsys):
    def refused(*argv) -> str:
        assert main([*argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    assert "--ray: only with a closed-loop check" in refused("explain", "--closed-loop-tracks", "0", "--ray")
    too_many = str(available_cores() + 1)
    assert "--workers" in refused("tune", "--data", str(tmp_path), "--workers", too_many)
    assert "--workers" in refused("dagger", "--policy", str(tmp_path), "--workers", too_many)


def test_a_job_that_fails_raises_its_own_error(tmp_path):
    pytest.importorskip("ray")

    def fail(job):
        raise ValueError(f"job {job} is bad")

    with pytest.raises(ValueError, match="job 0 is bad"):
        list(tasks_on_ray(fail, [0], LOCAL))


def test_without_the_extra_ray_is_refused_in_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray: ImportError
    code = main(["collect", "carracing", "--expert", "teacher-discrete", "--episodes", "1", "--max-steps", "5",
                 "--out", str(tmp_path), "--ray"])
    err = capsys.readouterr().err
    assert code == 2 and EXTRA_HINT in err and len(err.strip().splitlines()) == 1


def test_nac_drive_never_imports_ray_without_the_flag():
    script = ("import sys; from nac_drive.cli.main import main\n"
              "import nac_drive.pipeline.collect, nac_drive.pipeline.compare, nac_drive.pipeline.ray_tasks\n"
              "import nac_drive.pipeline.tune, nac_drive.pipeline.dagger, nac_drive.pipeline.explain\n"
              "for verb in ('compare', 'tune', 'dagger', 'explain'):\n"
              "    try:\n        main([verb, '--help'])\n    except SystemExit:\n        pass\n"
              "print('ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
