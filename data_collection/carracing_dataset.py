"""CarRacing demonstrations on disk, as Minari datasets (the Farama format for gymnasium
offline data), and the windows a temporal policy trains on.

A dataset is a Minari namespace of shards, each a Minari dataset holding consecutive
tracks (``ROOT`` is ``--out`` of ``nac-drive collect``, Minari's ``MINARI_DATASETS_PATH``)::

    ROOT/nac_drive/<name>/seeds-<first>-<last>-v1/data/main_data.hdf5   # one HDF5 group per episode
    ROOT/nac_drive/<name>/seeds-<first>-<last>-v1/data/metadata.json
    ROOT/.nac_drive.<name>.seeds-<first>-<last>-v1.<pid>.partial/      # while it is written (never loaded)
    ROOT/nac_drive/<name>/.claim.seeds-<first>-<last>.<pid>            # while a collect records those tracks

so ``minari.load_dataset("nac_drive/<name>/seeds-<first>-<last>-v1")`` reads a shard.
Shards are named by their tracks: processes or machines that collect disjoint seed ranges
of one dataset write shards that never collide, and copying them into one ``ROOT`` joins
the dataset (:func:`load_episodes` of ``ROOT/nac_drive/<name>`` reads them all). A
shard whose tracks are already in the dataset is refused, and so is a collect started
while another one records some of its tracks (:func:`claim_tracks`). ``-v1`` is the format version
(``DATASET_VERSION``): the env spec holds the TimeLimit and the wrappers the data was
recorded through, and the metadata an evaluation env and reference scores.

Per episode (Minari fields): ``observations`` uint8 ``[N+1, 96, 96, 3]`` (the raw RGB
frames the student sees, the last one after the final action; stored losslessly,
``jpeg_encoding=False``, gzip level 1 in HDF5: :func:`compress_observations`), ``actions`` ``[N]`` (discrete) or ``[N, 3]`` (continuous),
``rewards`` ``[N]``, ``terminations`` / ``truncations`` ``[N]``, and
``infos["timestamp"]`` ``[N+1]`` seconds since the episode began. Episode metadata
holds the reset ``seed`` and the ``expert`` that chose the actions; the dataset's
``algorithm_name`` names the expert as well. What the discrete GAS action pressed is read
from the env spec (its ``DiscreteActions`` wrapper, if any; else gymnasium's 0.2).

Loading (:func:`load_episodes`) accepts a shard folder or any folder above several,
checks every field, and raises :class:`DatasetError` naming the file and field.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from nac_drive.io.atomic import fsync_dir
from nac_drive.policy.tasks import DISCRETE_GAS
from nac_drive.simulators.frame_drops import window_frames

FRAME_SHAPE = (96, 96, 3)
PARTIAL = ".partial"   # suffix of the hidden folder a dataset is written in before it is renamed into place
NAMESPACE = "nac_drive"
DATASET_VERSION = 1    # v0: no namespace, and an env spec without the TimeLimit
_NAME = re.compile(r"[-\w]+")
_SHARD = re.compile(r"seeds-(\d+)-(\d+)-v(\d+)")
# benchmarks/minari_compression.py: a CarRacing episode's frames 15x smaller, read back in
# 1.1-1.25x the time of Minari's raw ones (lzf and gzip 4: 1.5x and more)
OBSERVATIONS_COMPRESSION = {"compression": "gzip", "compression_opts": 1}
CLAIM = ".claim"       # prefix of the hidden file that holds a range of tracks while a process records them
_CLAIM = re.compile(r"\.claim\.seeds-(\d+)-(\d+)\.(\d+)")


class DatasetError(ValueError):
    """A demonstration file is missing, corrupt or inconsistent."""


@dataclass
class Episode:
    """One demonstration. frames uint8 ``[N, 96, 96, 3]`` (the frame each action answered),
    actions ``[N]`` int64 or ``[N, 3]`` float32, rewards / timestamps ``[N]``."""

    frames: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    timestamps: np.ndarray
    seed: int | None
    expert: str
    source: str
    gas: float = DISCRETE_GAS
    """what the discrete GAS action pressed in the env it was recorded in"""
    terminated: bool = False
    """the env ended it (CarRacing: the lap finished, or the car left the playfield), not a time limit"""

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def total_reward(self) -> float:
        return float(self.rewards.sum())


@contextlib.contextmanager
def minari_root(root: str | Path):
    """Minari places datasets under $MINARI_DATASETS_PATH; point it at ``root`` meanwhile."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def shard_id(name: str, seeds: Sequence[int]) -> str:
    """Minari id of the shard of dataset ``name`` holding the consecutive tracks ``seeds``:
    ``nac_drive/<name>/seeds-<first>-<last>-v<DATASET_VERSION>``."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"dataset name {name!r}: use letters, digits, '-' and '_' only")
    seeds = [int(s) for s in seeds]
    if not seeds or seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise ValueError(f"dataset {name}: a shard holds consecutive track seeds, got {seeds[:5]}...")
    return f"{NAMESPACE}/{name}/seeds-{seeds[0]}-{seeds[-1]}-v{DATASET_VERSION}"


def dataset_folder(root: str | Path, name: str) -> Path:
    """The folder of dataset ``name`` under ``root`` (its shards are inside)."""
    return Path(root).resolve() / NAMESPACE / name


def recorded_tracks(root: str | Path, name: str) -> set[int]:
    """The track seeds the shards of dataset ``name`` under ``root`` hold (read from their names;
    none if there is no such dataset)."""
    held: set[int] = set()
    for shard in dataset_folder(root, name).glob("seeds-*"):
        match = _SHARD.fullmatch(shard.name)
        if match and shard.is_dir():
            held.update(range(int(match[1]), int(match[2]) + 1))
    return held


def refuse_existing(root: str | Path, name: str, seeds: Sequence[int]) -> Path:
    """The folder of the new shard of dataset ``name`` with tracks ``seeds``;
    ``FileExistsError`` if that shard exists or another shard of the dataset holds one of
    those tracks (call before recording, so that nothing is recorded in vain)."""
    target = Path(root).resolve() / shard_id(name, seeds)
    if target.exists():
        raise FileExistsError(f"{target}: a dataset of that name exists; remove it or record under another "
                              "name, seed or folder")
    first, last = int(seeds[0]), int(seeds[-1])
    for other in sorted(target.parent.glob("seeds-*")):
        match = _SHARD.fullmatch(other.name)
        if match and int(match[1]) <= last and first <= int(match[2]):
            raise FileExistsError(f"{other}: dataset {name} already holds some of the tracks "
                                  f"{seeds[0]}..{seeds[-1]}; record other seeds or under another name")
    return target


@contextlib.contextmanager
def claim_tracks(root: str | Path, name: str, seeds: Sequence[int]):
    """Hold the consecutive tracks ``seeds`` of dataset ``name`` while this process records
    them: ``FileExistsError`` (one line) if a shard of the dataset holds one of them, or a
    live process's claim does (two collects started at once with overlapping seeds).

    The claim is a hidden file ``<dataset>/.claim.seeds-<first>-<last>.<pid>`` holding the
    process's start time, made with ``O_EXCL`` while the dataset's ``.claims.lock`` is held
    (filelock's lock, which goes with a killed process), so of two concurrent collects exactly
    one wins; it is removed on exit (the empty lock file stays: removing it while another collect
    waits on it would let a third take a new one). A claim whose process is gone (killed) is
    stale: ignored and removed.
    """
    from filelock import FileLock

    first, last = int(seeds[0]), int(seeds[-1])
    folder = dataset_folder(root, name)
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{CLAIM}.seeds-{first}-{last}.{os.getpid()}"
    with FileLock(folder / ".claims.lock"):
        refuse_existing(root, name, seeds)
        for other in sorted(folder.glob(f"{CLAIM}.*")):
            match = _CLAIM.fullmatch(other.name)
            if not match:
                continue
            if not _claim_alive(other, int(match[3])):
                other.unlink(missing_ok=True)
            elif int(match[1]) <= last and first <= int(match[2]):
                raise FileExistsError(f"{other}: another collect (pid {match[3]}) is recording tracks "
                                      f"{match[1]}..{match[2]} of dataset {name}, some of {first}..{last}; "
                                      "record other seeds or under another name")
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(f"{_start_time(os.getpid())}\n")
    try:
        yield mine
    finally:
        mine.unlink(missing_ok=True)


def _start_time(pid: int) -> str:
    """When process ``pid`` started ('' if it is gone): tells a process from a later one
    that reuses its id. Linux: clock ticks since boot, read exactly from /proc (psutil's
    float in seconds is derived from them and the boot time); elsewhere psutil's seconds."""
    import psutil

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            return repr(psutil.Process(pid).create_time())
        except psutil.Error:
            return ""
    return stat.rpartition(")")[2].split()[19]


def _claim_alive(claim: Path, pid: int) -> bool:
    """Whether the process that wrote ``claim`` still runs (not a later one with its id)."""
    if not _running(pid):
        return False
    try:
        started = claim.read_text().strip()
    except OSError:
        return False
    now = _start_time(pid)
    return not started or not now or started == now


def write_dataset(root: str | Path, name: str, episodes: list[dict], env, expert: str, description: str,
                  eval_env=None) -> Path:
    """Write recorded episodes as a shard of dataset ``name`` under ``root``; returns its path.

    ``env`` is the env the episodes were recorded in (a ``gym.Env`` below any recorder,
    or its ``EnvSpec`` / id): its spec, with the TimeLimit and every wrapper, becomes the
    dataset's, so ``recover_environment()`` rebuilds it; a wrapper that cannot be
    recreated from the spec is refused. ``eval_env`` (default: ``env`` without its extra
    wrappers but :class:`DiscreteActions`, which sets what the actions do) is the held-out
    evaluation env. CarRacing datasets get the measured reference scores (random policy,
    teacher) of their env, where they were measured.

    Each episode dict holds ``observations`` ``[N+1, 96, 96, 3]``, ``actions``,
    ``rewards``, ``terminations``, ``truncations`` ``[N]``, ``timestamps`` ``[N+1]`` and
    ``seed`` (consecutive over the episodes: they name the shard). Refuses to overwrite
    an existing shard. :func:`stage_shard` then :func:`commit_shards`, so a kill leaves no
    dataset to be loaded later.
    """
    return commit_shards([stage_shard(root, name, episodes, env, expert, description, eval_env)])[0]


@dataclass(frozen=True)
class StagedShard:
    """A shard written in full, in the hidden folder ``staging``, not yet part of its dataset."""

    staging: Path   # root/.<dataset id>.<owner pid>.partial
    written: Path   # the shard inside it
    target: Path    # where :func:`commit_shards` moves it
    root: Path
    name: str


def stage_shard(root: str | Path, name: str, episodes: list[dict], env, expert: str, description: str,
                eval_env=None, owner: int | None = None) -> StagedShard:
    """Write a shard (see :func:`write_dataset`) into a hidden staging folder of ``root``
    named after ``owner``, the process that will commit it (default: this one): while that
    process lives no one removes it, and once it is gone (killed) the next write does. A
    disk too small for the shard is refused before anything is written (h5py crashes the
    process when the disk fills mid-write)."""
    import minari
    from minari.data_collector import EpisodeBuffer

    from nac_drive import __version__

    seeds = [ep["seed"] for ep in episodes]
    dataset_id = shard_id(name, seeds)
    target = refuse_existing(root, name, seeds)
    root = Path(root).resolve()   # Minari would join a relative root onto itself
    spec, eval_spec = _env_specs(env, eval_env)
    buffers = [EpisodeBuffer(id=i, seed=ep["seed"], observations=ep["observations"], actions=ep["actions"],
                             rewards=np.asarray(ep["rewards"], np.float32),
                             terminations=np.asarray(ep["terminations"], bool),
                             truncations=np.asarray(ep["truncations"], bool),
                             infos={"timestamp": np.asarray(ep["timestamps"], np.float64)})
               for i, ep in enumerate(episodes)]
    root.mkdir(parents=True, exist_ok=True)
    refuse_full_disk(root, sum(np.asarray(ep["observations"]).nbytes for ep in episodes))
    _remove_abandoned(root)
    staging = root / f".{dataset_id.replace('/', '.')}.{owner or os.getpid()}{PARTIAL}"
    staging.mkdir()
    try:
        with minari_root(staging), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`author_email` is set to None")
            dataset = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=spec, eval_env=eval_spec, algorithm_name=expert, author="nac-drive",
                code_permalink=f"nac-drive {__version__} (nac_drive.data_collection.carracing_dataset)",
                description=description, jpeg_encoding=False,
                requirements=["gymnasium[box2d]>=1.0", f"nac-drive>={__version__}"],
                **_reference_scores(eval_spec))
            dataset.storage.update_episode_metadata([{"seed": ep["seed"], "expert": expert} for ep in episodes],
                                                    episode_indices=range(len(episodes)))
        compress_observations(staging / dataset_id / "data" / "main_data.hdf5")
        fsync_dir(staging / dataset_id / "data")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)   # never leave a half-written dataset behind
        raise
    return StagedShard(staging, staging / dataset_id, target, root, name)


def compress_observations(h5_path: Path) -> None:
    """Rewrite a Minari HDF5 file with every episode's ``observations`` gzip-compressed
    (``OBSERVATIONS_COMPRESSION``; Minari writes them raw and takes no option). A copy, not
    an in-place rewrite: HDF5 never gives a deleted dataset's space back."""
    import h5py

    packed = h5_path.with_name(h5_path.name + ".gzip")
    with h5py.File(h5_path, "r") as source, h5py.File(packed, "w") as target:
        target.attrs.update(source.attrs)
        for name, item in source.items():
            if not (isinstance(item, h5py.Group) and isinstance(item.get("observations"), h5py.Dataset)):
                source.copy(item, target, name=name)
                continue
            group = target.create_group(name)
            group.attrs.update(item.attrs)
            for field, child in item.items():
                if field == "observations":
                    group.create_dataset(field, data=child[()], chunks=True, **OBSERVATIONS_COMPRESSION)
                else:
                    source.copy(child, group, name=field)
    os.replace(packed, h5_path)


def commit_shards(shards: Sequence[StagedShard]) -> list[Path]:
    """Move staged shards into their datasets, all or none: if one cannot be (its place was
    taken meanwhile), those already moved are taken back out. The staging folders go either way."""
    moved: list[StagedShard] = []
    try:
        for shard in shards:
            ensure_namespace(shard.root, shard.name)
            try:
                os.rename(shard.written, shard.target)
            except OSError:
                raise FileExistsError(f"{shard.target}: a dataset of that name appeared while this one was "
                                      "written") from None
            moved.append(shard)
            fsync_dir(shard.target.parent)
    except BaseException:
        for shard in moved:   # out of the dataset in one rename, then removed with its staging folder
            os.rename(shard.target, shard.written)
        raise
    finally:
        discard_shards(shards)
    return [shard.target for shard in shards]


def discard_shards(shards: Sequence[StagedShard]) -> None:
    """Remove staged shards that will not be committed."""
    for shard in shards:
        shutil.rmtree(shard.staging, ignore_errors=True)


def remove_staged_by(root: str | Path, owner: int) -> None:
    """Remove every shard ``owner`` staged under ``root`` (its workers' too): a run that failed."""
    for folder in Path(root).glob(f".*.{owner}{PARTIAL}"):
        shutil.rmtree(folder, ignore_errors=True)


DISK_MARGIN_BYTES = 64 * 2**20   # kept free beside a shard (metadata, the filesystem's own needs)


def refuse_full_disk(root: Path, frame_bytes: int) -> None:
    """Refuse, before anything is written, a shard whose frames (``frame_bytes`` raw; HDF5
    stores them uncompressed) would not fit on the disk of ``root`` with a margin."""
    free = shutil.disk_usage(root).free
    if frame_bytes + DISK_MARGIN_BYTES > free:
        raise OSError(errno.ENOSPC, f"{root}: {free / 2**20:.0f} MiB free, a shard of these episodes needs "
                                    f"{(frame_bytes + DISK_MARGIN_BYTES) / 2**20:.0f} MiB; free some space or "
                                    "record fewer episodes")


def ensure_namespace(root: str | Path, name: str) -> None:
    """Create the Minari namespaces ``nac_drive`` and ``nac_drive/<name>`` under ``root``
    (Minari lists a dataset's shards through them); existing ones are kept."""
    from minari.namespace import NAMESPACE_METADATA_FILENAME, create_namespace

    root = Path(root).resolve()
    with minari_root(root):
        for namespace, about in ((NAMESPACE, "nac-drive demonstrations"),
                                 (f"{NAMESPACE}/{name}", f"shards of dataset {name}, one per range of tracks")):
            if not (root / namespace / NAMESPACE_METADATA_FILENAME).is_file():
                with contextlib.suppress(ValueError):   # another process created it meanwhile
                    create_namespace(namespace, description=about)


def _env_specs(env, eval_env):
    """(spec of ``env``, spec of the evaluation env); refuses a spec gymnasium cannot rebuild."""
    import gymnasium as gym

    from nac_drive.simulators.carracing import ENV_ID, action_wrappers, spec_action_args

    spec = env.spec if isinstance(env, gym.Env) else gym.spec(env) if isinstance(env, str) else env
    if spec is None:
        raise ValueError("write_dataset: the env has no spec (make it with gymnasium.make)")
    opaque = [w.name for w in spec.additional_wrappers if w.kwargs is None]
    if opaque:
        raise ValueError(f"write_dataset: wrapper(s) {', '.join(opaque)} cannot be recreated from env.spec "
                         "(they need gymnasium.utils.RecordConstructorArgs)")
    if eval_env is None:   # the task's env: what the actions mean stays, disturbances go
        return spec, dataclasses.replace(spec, additional_wrappers=action_wrappers(spec))
    eval_spec = eval_env.spec if isinstance(eval_env, gym.Env) else eval_env
    if spec.id == eval_spec.id == ENV_ID:
        recorded, evaluated = spec_action_args(spec), spec_action_args(eval_spec)
        if recorded != evaluated:
            raise ValueError(f"write_dataset: the evaluation env's actions (continuous, gas) {evaluated} are not "
                             f"the recorded env's {recorded}")
    return spec, eval_spec


def _reference_scores(eval_spec) -> dict:
    """Minari's ``ref_min_score`` / ``ref_max_score`` for CarRacing (random policy, teacher,
    on the held-out tracks); none for another env, or a gas whose references were not measured."""
    from nac_drive.simulators.carracing import ENV_ID, reference_scores, spec_action_args

    scores = reference_scores(*spec_action_args(eval_spec)) if eval_spec.id == ENV_ID else None
    if scores is None:
        return {}
    low, high, tracks = scores
    return {"ref_min_score": low, "ref_max_score": high, "num_episodes_average_score": tracks}


def _remove_abandoned(root: Path) -> None:
    """Remove the hidden folders of writes under ``root`` whose process is gone (killed)."""
    for folder in root.glob(f".*{PARTIAL}"):
        pid = folder.name[:-len(PARTIAL)].rpartition(".")[2]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    import psutil

    # not os.kill(pid, 0): on Windows signal 0 is CTRL_C_EVENT, sent to the process
    return psutil.pid_exists(pid)


def find_datasets(path: str | Path, missing_ok: bool = False) -> list[Path]:
    """Minari dataset folders (holding ``data/metadata.json``) at or below ``path``, shards of
    one dataset in the order of their tracks; hidden folders (a dataset being written) are
    skipped. None found is a :class:`DatasetError`, or with ``missing_ok`` an empty list."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return []
        raise DatasetError(f"{path}: no such file or folder")
    if (path / "data" / "metadata.json").is_file():
        return [path]
    if path.name == "data" and (path / "metadata.json").is_file():
        return [path.parent]
    found = sorted((p.parent.parent for p in _metadata_files(path)), key=_track_order)
    if not found and not missing_ok:
        raise DatasetError(f"{path}: no Minari dataset (…/data/metadata.json) found")
    return found


def _metadata_files(path: Path):
    """Every ``data/metadata.json`` below ``path``, through symlinked folders too (a dataset
    linked in from elsewhere), each real folder once (a link back up cannot loop); hidden
    folders skipped."""
    seen: set[str] = set()
    for folder, subfolders, files in os.walk(path, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        if Path(folder).name == "data" and "metadata.json" in files:
            yield Path(folder) / "metadata.json"


def _track_order(folder: Path):
    match = _SHARD.fullmatch(folder.name)   # numerically: seeds-99999-... before seeds-100000-...
    return (folder.parent, int(match[1]) if match else -1, folder.name)


def load_episodes(path: str | Path) -> list[Episode]:
    """Every episode of every dataset at or below ``path``, validated.

    A dataset the previous call loaded, whose file is unchanged since, is not read again:
    DAgger re-trains on all its datasets after each round adds a small one, and reading
    ~65k frames takes ~25 s here. Only the previous call's datasets are kept.
    """
    global _last_loaded
    loaded = {}
    folders = [folder.resolve() for folder in find_datasets(path)]
    _refuse_overlapping_shards(folders)
    for folder in folders:
        stamp = _file_stamp(folder / "data" / "main_data.hdf5")
        kept = _last_loaded.get(folder)
        loaded[folder] = kept if kept is not None and kept[0] == stamp else (stamp, _load_one(folder))
    _last_loaded = loaded
    return [ep for _, episodes in loaded.values() for ep in episodes]


_last_loaded: dict[Path, tuple[tuple, list[Episode]]] = {}   # folder -> (file stamp, its episodes)


def _refuse_overlapping_shards(folders: list[Path]) -> None:
    """:class:`DatasetError` if two shards of one dataset hold a track in common (copied
    together from runs that collected overlapping seeds): its episodes would be trained on
    twice, and could be in training and validation at once."""
    ranges: dict[Path, list[tuple[int, int, Path]]] = {}
    for folder in folders:
        match = _SHARD.fullmatch(folder.name)
        if match:
            ranges.setdefault(folder.parent, []).append((int(match[1]), int(match[2]), folder))
    for shards in ranges.values():
        shards.sort()
        for (_, last, a), (first, _, b) in zip(shards, shards[1:]):
            if first <= last:
                raise DatasetError(f"{b}: holds tracks of {a.name} as well (from {first}); remove one of the two")


def _file_stamp(path: Path) -> tuple | None:
    """What tells a rewritten file from the one read before (None: no file)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _load_one(folder: Path) -> list[Episode]:
    from minari import MinariDataset

    data = folder / "data"
    try:
        _check_declared_size(data / "main_data.hdf5")
        dataset = MinariDataset(data)
        metadata = list(dataset.storage.get_episode_metadata(range(dataset.total_episodes)))
        raw = list(dataset.iterate_episodes())
    except DatasetError:
        raise
    except Exception as e:  # h5py / json / minari all raise their own types on a corrupt file
        raise _unreadable(data / "main_data.hdf5", e) from None
    expert_default = str(dataset.storage.metadata.get("algorithm_name") or "unknown")
    gas = _recorded_gas(dataset, data)
    episodes = []
    for ep, meta in zip(raw, metadata):
        where = f"{data / 'main_data.hdf5'} episode {ep.id}"
        obs, actions = np.asarray(ep.observations), np.asarray(ep.actions)
        n = len(actions)
        _require(obs.dtype == np.uint8 and obs.shape[1:] == FRAME_SHAPE, where, "observations",
                 f"expected uint8 [N+1, 96, 96, 3], got {obs.dtype} {list(obs.shape)}")
        _require(len(obs) == n + 1, where, "observations", f"{len(obs)} frames for {n} actions (expected N+1)")
        _require(n > 0, where, "actions", "empty episode")
        _require(actions.ndim == 1 or gas == DISCRETE_GAS, where, "actions",
                 f"the env's GAS presses {gas}, so its actions must be discrete")
        if actions.ndim == 1:
            _require(np.issubdtype(actions.dtype, np.integer) and actions.min() >= 0 and actions.max() < 5,
                     where, "actions", "discrete actions must be integers in 0..4")
            actions = actions.astype(np.int64)
        else:
            _require(actions.shape[1:] == (3,) and np.isfinite(actions).all(), where, "actions",
                     f"continuous actions must be finite [N, 3], got {list(actions.shape)}")
            actions = actions.astype(np.float32)
        rewards = np.asarray(ep.rewards, np.float32)
        _require(rewards.shape == (n,) and np.isfinite(rewards).all(), where, "rewards", "expected N finite values")
        stamps = np.asarray(ep.infos.get("timestamp", []) if isinstance(ep.infos, dict) else [], np.float64)
        _require(stamps.shape == (n + 1,) and np.isfinite(stamps).all() and np.all(np.diff(stamps) > 0), where,
                 "infos/timestamp", "expected N+1 finite, increasing timestamps")
        seed = meta.get("seed") if isinstance(meta, dict) else None
        terminations = np.asarray(ep.terminations, bool)
        _require(terminations.shape == (n,), where, "terminations", "expected N values")
        episodes.append(Episode(frames=obs[:n], actions=actions, rewards=rewards, timestamps=stamps[:n],
                                seed=None if seed is None else int(seed),
                                expert=str(meta.get("expert", expert_default)) if isinstance(meta, dict)
                                else expert_default, source=where, gas=gas, terminated=bool(terminations[-1])))
    return episodes


def refuse_other_gas(path: str | Path, gas: float, option: str) -> None:
    """``ValueError`` naming ``option`` if a dataset at or below ``path`` (none is fine) was
    recorded in an env whose GAS presses another gas than ``gas``: data written there now
    could never be trained on together with it."""
    other = {folder: g for folder, g in recorded_gases(path).items() if g != gas}
    if other:
        folder, other_gas = next(iter(other.items()))
        raise ValueError(f"{option}: {folder} was recorded in an env whose GAS presses {other_gas}, not "
                         f"{gas} ({len(other)} such dataset(s))")


def recorded_gases(path: str | Path) -> dict[Path, float]:
    """What GAS pressed in the env of every dataset at or below ``path`` (read from the
    metadata: no episode is loaded), by shard folder; none if there is no dataset."""
    from minari import MinariDataset

    gases = {}
    for folder in find_datasets(path, missing_ok=True):
        try:
            dataset = MinariDataset(folder / "data")
        except Exception as e:  # as in _load_one
            raise _unreadable(folder / "data", e) from None
        gases[folder] = _recorded_gas(dataset, folder / "data")
    return gases


def _unreadable(where: Path, e: Exception) -> DatasetError:
    return DatasetError(f"{where}: cannot read the Minari dataset ({type(e).__name__}: {e})")


def _recorded_gas(dataset, data: Path) -> float:
    """What GAS pressed in the env the dataset was recorded in (its env spec; without one,
    gymnasium's)."""
    from nac_drive.simulators.carracing import spec_action_args

    if dataset.env_spec is None:
        return DISCRETE_GAS
    try:
        _, gas = spec_action_args(dataset.env_spec)
        return gas
    except ValueError as e:
        raise DatasetError(f"{data / 'metadata.json'}: {e}") from None


def _check_declared_size(h5_path: Path) -> None:
    """Refuse an HDF5 file whose arrays, as declared, would not fit in this machine's
    memory (loading reads them all): a small compressed file can declare any size."""
    import h5py

    sizes = []
    with h5py.File(h5_path, "r") as f:
        f.visititems(lambda _, item: sizes.append(item.size * item.dtype.itemsize)
                     if isinstance(item, h5py.Dataset) else None)
    import psutil

    memory = psutil.virtual_memory().total
    if sum(sizes) > memory:
        raise DatasetError(f"{h5_path}: its arrays would take {sum(sizes)} bytes, more than this machine's "
                           f"memory ({memory} bytes)")


def _require(ok: bool, where: str, field: str, why: str) -> None:
    if not ok:
        raise DatasetError(f"{where}: {field}: {why}")


def split_by_episode(episodes: list[Episode], val_fraction: float, seed: int) -> tuple[list[Episode], list[Episode]]:
    """Hold out whole episodes (never single frames) for validation: at least one when
    there are two or more episodes, none when there is one."""
    if len(episodes) < 2 or val_fraction <= 0:
        return list(episodes), []
    order = np.random.default_rng(seed).permutation(len(episodes))
    n_val = min(len(episodes) - 1, max(1, round(val_fraction * len(episodes))))
    val = set(order[:n_val].tolist())
    return [e for i, e in enumerate(episodes) if i not in val], [e for i, e in enumerate(episodes) if i in val]


class WindowDataset(torch.utils.data.Dataset):
    """Every run of ``window`` consecutive frames of every episode.

    Item: frames uint8 ``[W, 3, 96, 96]``, timestamps ``[W]`` (seconds, from the window's
    first frame: the recorded ones, frame index / 50 s), actions ``[W]`` or ``[W, 3]``.
    Episodes shorter than the window are skipped, which keeps batches rectangular.
    ``index[i]`` is window ``i``'s (episode, first frame); :meth:`frames_of` and :meth:`labels`
    give its parts (validation encodes each frame once, however many windows hold it).

    ``frame_drop`` P > 0 (training on irregular time): each epoch (:meth:`set_epoch`) a share P
    of every episode's frames is dropped, by the closed loop's schedule seeded with ``(seed,
    epoch, episode)``, and window ``i`` is cut from the frames left
    (:func:`~nac_drive.simulators.frame_drops.window_frames`): ``W`` frames that span more
    time, with their recorded timestamps, as a policy's window does in a drive under
    ``--perturb frame-drop=P``.
    """

    def __init__(self, episodes: list[Episode], window: int, frame_drop: float = 0.0, seed: int = 0):
        self.episodes, self.window, self.frame_drop, self.seed = episodes, window, frame_drop, seed
        self.epoch = 0
        self.index = [(e, s) for e, ep in enumerate(episodes) for s in range(len(ep) - window + 1)]

    def set_epoch(self, epoch: int) -> None:
        """Redraw the dropped frames (call once per training epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        return (self.frames_of(self.index[i][0], self.positions(i)), *self.labels(i))

    def positions(self, i: int) -> np.ndarray:
        """Window ``i``'s frames in its episode ``[W]``: consecutive, or under ``frame_drop`` those left."""
        e, s = self.index[i]
        return window_frames(self.frame_drop, (self.seed, self.epoch, e), len(self.episodes[e]), s, self.window)

    def frames_of(self, e: int, positions: np.ndarray | slice) -> torch.Tensor:
        """Frames at ``positions`` of episode ``e``: uint8 ``[n, 3, 96, 96]``."""
        return torch.from_numpy(self.episodes[e].frames[positions]).permute(0, 3, 1, 2)

    def labels(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Window ``i``'s timestamps ``[W]`` and actions, without its frames."""
        ep, at = self.episodes[self.index[i][0]], self.positions(i)
        stamps = torch.from_numpy(ep.timestamps[at] - ep.timestamps[at[0]]).float()
        return stamps, torch.from_numpy(ep.actions[at])
