"""processes.map_in_processes: jobs side by side in worker processes (compare --workers,
collection's and DAgger's shards)."""

import time
from functools import partial
from pathlib import Path

import pytest

from nac_drive.pipeline.processes import map_in_processes


def _job(folder: str, job: tuple[int, float]) -> int:
    """Marks that ``job`` started, sleeps its time, returns its number (job 0 fails)."""
    number, seconds = job
    (Path(folder) / f"started-{number}").touch()
    time.sleep(seconds)
    if number == 0:
        raise RuntimeError("job 0 failed")
    return number * 10


def test_results_come_back_in_the_order_of_the_jobs_whatever_order_they_finish(tmp_path):
    jobs = [(1, 0.6), (2, 0.0), (3, 0.3), (4, 0.0)]
    assert map_in_processes(partial(_job, str(tmp_path)), jobs, 2) == [10, 20, 30, 40]
    assert map_in_processes(partial(_job, str(tmp_path)), [], 2) == []


def test_after_a_failed_job_no_other_starts_and_its_error_comes_back(tmp_path):
    """Job 0 fails at once while job 1 runs: jobs 2-7 were never handed to the pool. (A pool
    given every job at once queues some ahead of its workers, and those start anyway.)"""
    jobs = [(0, 0.0), (1, 1.0)] + [(n, 0.0) for n in range(2, 8)]
    with pytest.raises(RuntimeError, match="job 0 failed"):
        map_in_processes(partial(_job, str(tmp_path)), jobs, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["started-0", "started-1"]
