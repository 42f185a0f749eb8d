"""CarRacing demonstrations on disk, as Minari datasets (the Farama format for gymnasium
offline data), and the windows a temporal policy trains on.

Layout written by :func:`write_dataset` (``ROOT`` is ``--out`` of ``nac-drive collect``)::

    ROOT/<dataset name>-v0/data/main_data.hdf5     # Minari: one HDF5 group per episode
    ROOT/<dataset name>-v0/data/metadata.json
    ROOT/.<dataset name>-v0.<pid>.partial/        # while it is written (never loaded)

Per episode (Minari fields): ``observations`` uint8 ``[N+1, 96, 96, 3]`` (the raw RGB
frames the student sees, the last one after the final action; stored losslessly,
``jpeg_encoding=False``), ``actions`` ``[N]`` (discrete) or ``[N, 3]`` (continuous),
``rewards`` ``[N]``, ``terminations`` / ``truncations`` ``[N]``, and
``infos["timestamp"]`` ``[N+1]`` seconds since the episode began. Episode metadata
holds the reset ``seed`` and the ``expert`` that chose the actions; the dataset's
``algorithm_name`` names the expert as well.

Loading (:func:`load_episodes`) accepts a dataset folder or any folder above several,
checks every field, and raises :class:`DatasetError` naming the file and field.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nac_drive.atomic import fsync_dir

FRAME_SHAPE = (96, 96, 3)
PARTIAL = ".partial"   # suffix of the hidden folder a dataset is written in before it is renamed into place


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

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def total_reward(self) -> float:
        return float(self.rewards.sum())


@contextlib.contextmanager
def _minari_root(root: Path):
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


def dataset_folder(root: str | Path, name: str) -> Path:
    """Where :func:`write_dataset` puts dataset ``name`` under ``root``."""
    return Path(root).resolve() / f"{name}-v0"


def refuse_existing(root: str | Path, name: str) -> Path:
    """The folder of a new dataset ``name``; ``FileExistsError`` if it exists (call before
    recording, so that nothing is recorded in vain)."""
    target = dataset_folder(root, name)
    if target.exists():
        raise FileExistsError(f"{target}: a dataset of that name exists; remove it or record under another "
                              "name, seed or folder")
    return target


def write_dataset(root: str | Path, name: str, episodes: list[dict], env, expert: str, description: str) -> Path:
    """Write recorded episodes as the Minari dataset ``root/<name>-v0``; returns its path.

    Each episode dict holds ``observations`` ``[N+1, 96, 96, 3]``, ``actions``,
    ``rewards``, ``terminations``, ``truncations`` ``[N]``, ``timestamps`` ``[N+1]`` and
    ``seed``. Refuses to overwrite an existing dataset. The dataset is written in a hidden
    folder ``root/.<name>-v0.<pid>.partial`` and renamed into place when complete, so a
    kill leaves no dataset to be loaded later (the next write removes what it left).
    """
    import minari
    from minari.data_collector import EpisodeBuffer

    target = refuse_existing(root, name)   # resolved: Minari joins a relative root onto itself
    root = target.parent
    buffers = [EpisodeBuffer(id=i, seed=ep["seed"], observations=ep["observations"], actions=ep["actions"],
                             rewards=np.asarray(ep["rewards"], np.float32),
                             terminations=np.asarray(ep["terminations"], bool),
                             truncations=np.asarray(ep["truncations"], bool),
                             infos={"timestamp": np.asarray(ep["timestamps"], np.float64)})
               for i, ep in enumerate(episodes)]
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root)
    staging = root / f".{target.name}.{os.getpid()}{PARTIAL}"
    staging.mkdir()
    try:
        with _minari_root(staging), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`(author_email|eval_env|code_permalink)` is set to None")
            dataset = minari.create_dataset_from_buffers(
                target.name, buffers, env=env, algorithm_name=expert, author="nac-drive",
                description=description, jpeg_encoding=False)
            dataset.storage.update_episode_metadata([{"seed": ep["seed"], "expert": expert} for ep in episodes],
                                                    episode_indices=range(len(episodes)))
        fsync_dir(staging / target.name / "data")
        try:
            os.rename(staging / target.name, target)
        except OSError:
            raise FileExistsError(f"{target}: a dataset of that name appeared while this one was written") from None
        fsync_dir(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)   # never leave a half-written dataset behind
    return target


def _remove_abandoned(root: Path) -> None:
    """Remove the hidden folders of writes under ``root`` whose process is gone (killed)."""
    for folder in root.glob(f".*{PARTIAL}"):
        pid = folder.name[:-len(PARTIAL)].rpartition(".")[2]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    return True


def find_datasets(path: str | Path) -> list[Path]:
    """Minari dataset folders (holding ``data/metadata.json``) at or below ``path``; hidden
    folders (a dataset being written) are skipped."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    if (path / "data" / "metadata.json").is_file():
        return [path]
    if path.name == "data" and (path / "metadata.json").is_file():
        return [path.parent]
    found = sorted(p.parent.parent for p in path.rglob("data/metadata.json")
                   if not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not found:
        raise DatasetError(f"{path}: no Minari dataset (…/data/metadata.json) found")
    return found


def load_episodes(path: str | Path) -> list[Episode]:
    """Every episode of every dataset at or below ``path``, validated."""
    return [ep for folder in find_datasets(path) for ep in _load_one(folder)]


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
        raise DatasetError(f"{data / 'main_data.hdf5'}: cannot read the Minari dataset "
                           f"({type(e).__name__}: {e})") from None
    expert_default = str(dataset.storage.metadata.get("algorithm_name") or "unknown")
    episodes = []
    for ep, meta in zip(raw, metadata):
        where = f"{data / 'main_data.hdf5'} episode {ep.id}"
        obs, actions = np.asarray(ep.observations), np.asarray(ep.actions)
        n = len(actions)
        _require(obs.dtype == np.uint8 and obs.shape[1:] == FRAME_SHAPE, where, "observations",
                 f"expected uint8 [N+1, 96, 96, 3], got {obs.dtype} {list(obs.shape)}")
        _require(len(obs) == n + 1, where, "observations", f"{len(obs)} frames for {n} actions (expected N+1)")
        _require(n > 0, where, "actions", "empty episode")
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
        episodes.append(Episode(frames=obs[:n], actions=actions, rewards=rewards, timestamps=stamps[:n],
                                seed=None if seed is None else int(seed),
                                expert=str(meta.get("expert", expert_default)) if isinstance(meta, dict)
                                else expert_default, source=where))
    return episodes


def _check_declared_size(h5_path: Path) -> None:
    """Refuse an HDF5 file whose arrays, as declared, would not fit in this machine's
    memory (loading reads them all): a small compressed file can declare any size."""
    import h5py

    sizes = []
    with h5py.File(h5_path, "r") as f:
        f.visititems(lambda _, item: sizes.append(item.size * item.dtype.itemsize)
                     if isinstance(item, h5py.Dataset) else None)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
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
    first frame), actions ``[W]`` or ``[W, 3]``. Episodes shorter than the window are
    skipped, which keeps batches rectangular.
    """

    def __init__(self, episodes: list[Episode], window: int):
        self.episodes, self.window = episodes, window
        self.index = [(e, s) for e, ep in enumerate(episodes) for s in range(len(ep) - window + 1)]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        e, s = self.index[i]
        ep, w = self.episodes[e], self.window
        frames = torch.from_numpy(ep.frames[s:s + w]).permute(0, 3, 1, 2)
        stamps = torch.from_numpy(ep.timestamps[s:s + w] - ep.timestamps[s]).float()
        return frames, stamps, torch.from_numpy(ep.actions[s:s + w])
