"""Stages' jobs as Ray tasks, on this machine or across a cluster: ``--ray [ADDRESS]``.

The jobs are those of the process pool (:mod:`nac_drive.pipeline.processes`): collection's
and DAgger's runs of consecutive tracks (:mod:`~nac_drive.pipeline.shards`), ``compare``'s
(variant, seed), ``tune``'s trials, ``explain``'s closed-loop drives; the same split, so the
same seeds give the same shards and tables; only where they run changes. Each job is one Ray
task of one CPU and one torch thread. A task returns what it made and only this process
(Ray's driver) writes it, as each task finishes: a worker on another machine needs no access
to the output folder (``compare``'s runs and ``tune``'s trials still train into ``--out``,
which the nodes then share). A verb that alternates its own work with rounds of tasks keeps
one Ray session for all of them (:class:`RayJobs`).

Nothing phones home: Ray's usage statistics are switched off before Ray is imported
(``RAY_USAGE_STATS_ENABLED=0``; a cluster joined by address keeps what its ``ray start``
chose, ``--disable-usage-stats``) and no dashboard is started. ``--ray`` alone starts a
Ray of this machine's cores bound to the loopback address; ``--ray ADDRESS`` joins a
running cluster (``ray start --head``). Ray comes with the ``cluster`` extra; this module
imports it only when a run asks for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nac_drive.fields import arg

LOCAL = "local"   # --ray without an address: a new Ray on this machine, never one running already (ray.init's own name)
EXTRA_HINT = "pip install 'nac-drive[cluster]'"
RETRIES = 3       # times a job whose worker or node died runs again


def ray_arg() -> Any:
    """The ``--ray [ADDRESS]`` field of every verb whose jobs can run as Ray tasks."""
    return arg(None, "run the jobs as Ray tasks (the 'cluster' extra): --ray alone starts a local Ray on this "
                     "machine's cores; --ray ADDRESS joins a running cluster (ray start --head; e.g. auto or "
                     "HEAD:6379)", const=LOCAL, metavar="ADDRESS")


@contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Ray, started (``address`` :data:`LOCAL`) or joined for the block; the ``ray`` module.
    A missing extra is refused in one line."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"   # read by Ray whenever it would report
    if address == LOCAL:
        # read when Ray is imported: its nodes then take the loopback address, not the reachable one
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ValueError(f"--ray runs on Ray, the 'cluster' extra, which is not installed: {EXTRA_HINT}") from None
    from nac_drive.torch_threads import available_cores

    # Ray puts the driver's working folder first on its workers' path, where a checkout's own
    # nac_drive/ (run from the repository root) would shadow the installed package and its mapped
    # folders: the folder that holds the nac_drive this process imported goes there instead.
    here = os.getcwd()
    os.chdir(Path(sys.modules["nac_drive"].__file__).resolve().parents[1])
    try:
        if address == LOCAL:
            ray.init(address=LOCAL, num_cpus=available_cores(), include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    finally:
        os.chdir(here)
    try:
        yield ray
    finally:
        ray.shutdown()


def _run_job(call: Callable[[Any], Any], job: Any) -> Any:
    """One task: ``call(job)`` on one torch thread, as a pool worker runs it."""
    import torch

    torch.set_num_threads(1)
    return call(job)


class RayJobs:
    """Rounds of jobs as Ray tasks in one Ray session (:func:`ray_jobs`): a verb that alternates
    its own work with a round of tasks (DAgger's rounds, ``tune``'s batches of trials) starts
    Ray once. Counts the tasks, the nodes and the retries for the line that ends the session."""

    def __init__(self, ray):
        self.ray = ray
        # Ray's own max_retries would hide a retry from this process; it resubmits, and counts
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_job)
        self.tasks = self.retries = self.retried = 0

    def run(self, call: Callable[[Any], Any], jobs: list, *, desc: str | None = None, unit: str = "job",
            size: Callable[[Any], int] = lambda job: 1,
            name: Callable[[Any], str] | None = None) -> Iterator[tuple[int, Any]]:
        """``call(job)`` for every job as a Ray task; yields (the job's index, its result) as
        each finishes. With ``desc``, one bar counts ``size(job)`` per finished job (and shows
        ``name(job)`` of the last). A task whose worker or node died runs again (up to
        :data:`RETRIES` times); a job that raises cancels the others and its error is raised."""
        ray = self.ray
        died = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
                ray.exceptions.LocalRayletDiedError)
        running = {self._remote.remote(call, job): i for i, job in enumerate(jobs)}
        retried, bar = [0] * len(jobs), None
        if desc:
            from tqdm import tqdm
            bar = tqdm(total=sum(map(size, jobs)), desc=desc, unit=unit)
        try:
            while running:
                [ref], _ = ray.wait(list(running), num_returns=1)
                i = running.pop(ref)
                try:
                    result = ray.get(ref)
                except died:
                    if retried[i] == RETRIES:
                        raise
                    retried[i] += 1
                    running[self._remote.remote(call, jobs[i])] = i
                    continue
                if bar:
                    bar.update(size(jobs[i]))
                    if name:
                        bar.set_postfix_str(name(jobs[i]))
                yield i, result
        finally:
            for ref in running:   # a failed job, or the caller stopped: nothing more runs
                ray.cancel(ref, force=True)
            if bar:
                bar.close()
            self.tasks += len(jobs)
            self.retries += sum(retried)
            self.retried += sum(map(bool, retried))

    def summary(self) -> str:
        """The line that ends the session: the tasks, the nodes and the retried."""
        nodes = sum(node["Alive"] for node in self.ray.nodes())
        return tasks_summary(self.tasks, self.retries, self.retried, nodes)


@contextmanager
def ray_jobs(address: str | None) -> Iterator[RayJobs | None]:
    """A :class:`RayJobs` on Ray at ``address`` (:func:`ray_session`) for the block, its summary
    line printed on stderr at the end; None without an address (nothing started: the verb runs
    its jobs on this machine)."""
    if address is None:
        yield None
        return
    with ray_session(address) as ray:
        jobs = RayJobs(ray)
        yield jobs
        print(jobs.summary(), file=sys.stderr, flush=True)


def tasks_on_ray(call: Callable[[Any], Any], jobs: list, address: str, **bar) -> Iterator[tuple[int, Any]]:
    """One round of jobs in a Ray session of its own (:func:`ray_jobs`, :meth:`RayJobs.run`,
    ``bar``: its progress bar's arguments): yields (the job's index, its result) as each
    finishes, then the session ends with its one-line summary on stderr."""
    if not jobs:
        return
    with ray_jobs(address) as ray:
        yield from ray.run(call, jobs, **bar)


def tasks_summary(tasks: int, retries: int, retried: int, nodes: int) -> str:
    """The line that ends a run on Ray."""
    again = f"{retried} retried after its worker died ({retries} retries)" if retried else "none retried"
    return f"ray: {tasks} tasks on {nodes} node{'s' * (nodes != 1)}, {again}"


def everywhere(path: str | Path) -> str:
    """``path`` as every node of a cluster names it: absolute (a Ray worker's working folder is
    not this process's). A name that is no path here (a Hub id) passes as it is."""
    return str(Path(path).resolve()) if Path(path).exists() else str(path)
