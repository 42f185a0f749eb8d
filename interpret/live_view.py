"""A drive seen live in Rerun (rerun-sdk, the ``live`` extra): the frame, the saliency of the
chosen action, the actions, the reward and every traced NAC state, step by step.

:class:`RerunView` is a step sink like :class:`~nac_drive.interpret.trace.RunRecorder`: the
driver calls :meth:`RerunView.add` with the same arguments each step (plus the saliency
overlay) and :meth:`RerunView.new_episode` when the policy resets. :func:`trace_to_rrd`
replays a recorded trace (``RUN_DIR/trace/``, and its ``saliency.npz``) into the same recording.

Where it goes (:func:`open_view`): a ``.rrd`` file (headless; ``rerun FILE.rrd`` opens it),
a native Rerun viewer started for the drive, or a Rerun gRPC server that any viewer connects
to (``rerun --connect rerun+http://127.0.0.1:PORT/proxy``; from another machine through an
SSH tunnel), which keeps the recording for viewers that connect late. Viewer and server run
as a child process of the Rerun CLI bound to 127.0.0.1 (the SDK's own ``serve_grpc`` listens
on every interface), with Rerun's usage analytics turned off through a configuration folder
of nac-drive's own (:func:`viewer_config_home`), so the user's own Rerun settings and data
folders are left as they are. The server dies with the drive however the drive ends, ``kill -9``
included (:func:`nac_drive.child_processes.program_dies_with_us`); a native window outlives it. Rerun's web viewer is not offered: its page loads fonts from
Google and its viewer sends usage analytics from the browser, which nac-drive cannot turn off.

Recording layout. Timelines: ``step`` (the run's step: row ``i`` of the trace),
``episode`` and ``episode_step``. Entity paths (A / E = policy / expert action size, D =
d_model, K = selected keys, n = neurons of a backbone group, h = head):

=================================  ==========  ===============================================
entity                             archetype   value
=================================  ==========  ===============================================
``camera``                         Image       the frame the policy saw (JPEG)
``saliency``                       Image       Grad-CAM overlay of the chosen action (JPEG)
``action/policy``                  Scalars     [A] the policy's action (discrete: its index)
``action/expert``                  Scalars     [E] the expert's action for the same state
``reward/frame``                   Scalars     the step's reward
``reward/return``                  Scalars     the episode's return so far
``cte``                            Scalars     cross-track error, where the simulator has one
``nac/sensory/{q,k,v}``            Scalars     [D] sensory gate activations
``nac/head{h}/{inter,command,      Scalars     [n] backbone layer, mean over the selected pairs
motor}``
``nac/head{h}/{group}_top``        Scalars     [n] the same layer for the top-weighted pair
``nac/head{h}/{phi,tau,t_interp,   Scalars     [K] per selected key (NaN: an empty slot)
logits,weights,key_age}``
``nac/head{h}/attention``          BarChart    [window] weight by key age (frames ago)
=================================  ==========  ===============================================

Every value is the one the trace stores for that step (the same reduction,
:func:`~nac_drive.interpret.trace.reduce_nac_trace`), except ``key_age``, whose empty slots
are NaN here and -1 there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from nac_drive.child_processes import program_dies_with_us
from nac_drive.interpret.trace import BACKBONE_GROUPS, NAC_FIELDS, PER_KEY, RunTrace, reduce_nac_trace
from nac_drive.io.atomic import FULL_DISK_BYTES
from nac_drive.io.checkpoint import read_json, write_json

APPLICATION_ID = "nac-drive"
GRPC_PORT = 9876      # Rerun's own default proxy port
VIEWER_START_TIMEOUT_S = 20.0
JPEG_QUALITY = 90
FLUSH_TIMEOUT_S = 10.0   # a flush waits for its sinks; far longer means they stopped (:func:`_within`)


def require_rerun():
    """``import rerun``, or a one-line error naming the extra that brings it."""
    # the SDK's Rust log lines (ANSI-coloured) would follow nac-drive's one-line errors; RUST_LOG shows them
    os.environ.setdefault("RUST_LOG", "off")
    try:
        import rerun
    except ImportError:
        raise ValueError("--rerun needs rerun-sdk (the 'live' extra): pip install 'nac-drive[live]'") from None
    return rerun


# ------------------------------------------------------------------ where the recording goes
def rerun_executable() -> str:
    """The Rerun CLI that came with rerun-sdk (the package's ``rerun_cli``), else ``rerun`` on PATH."""
    try:
        import rerun_cli

        bundled = Path(rerun_cli.__file__).parent / "rerun"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("rerun")
    if found is None:
        raise ValueError("the Rerun viewer (the 'rerun' command of rerun-sdk) is not installed: "
                         "pip install 'nac-drive[live]'")
    return found


def viewer_config_home() -> Path:
    """nac-drive's own XDG_CONFIG_HOME for the viewers it starts, with Rerun's analytics off.

    Rerun reads its analytics setting from ``rerun/analytics.json`` under it and nothing else
    (its data and caches stay where they are). The file is written here, in the format
    ``rerun analytics disable`` writes (re_analytics' ``Config``), rather than by running that
    command, which queues an analytics event of its own in the user's data folder; the folder
    it names for pending events is one of nac-drive's own."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = base / "nac-drive" / "rerun-config"
    settings = home / "rerun" / "analytics.json"
    if not _analytics_disabled(settings):
        write_json(settings, {"analytics_enabled": False, "analytics_id": uuid.uuid4().hex, "metadata": {},
                              "config_file_path": str(settings), "data_dir_path": str(home / "rerun-analytics")})
    return home


def _analytics_disabled(settings: Path) -> bool:
    try:
        return read_json(settings).get("analytics_enabled") is False
    except (OSError, ValueError):   # missing or unreadable: written again
        return False


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_viewer(serve_port: int | None = None, host: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """Start the Rerun CLI bound to ``host``: the native viewer, or with ``serve_port`` a
    gRPC server (no window) there for viewers to connect to. Returns (process, gRPC URL to
    log to).

    Raises ValueError (one line) if it does not listen within :data:`VIEWER_START_TIMEOUT_S`
    (a taken port, no display for the native viewer)."""
    if serve_port is not None:
        port, mode = serve_port, ["--serve-grpc"]
    else:
        port, mode = _free_port(host), ["--expect-data-soon", "--hide-welcome-screen"]
    if _listening(host, port):
        raise ValueError(f"--rerun-serve: port {port} on {host} is in use")
    proc = subprocess.Popen([rerun_executable(), "--bind", host, "--port", str(port), *mode],
                            env={**os.environ, "XDG_CONFIG_HOME": str(viewer_config_home())},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            # a native window outlives the drive; a server dies with it, however it ends
                            start_new_session=serve_port is None,
                            preexec_fn=None if serve_port is None else program_dies_with_us())
    deadline = time.monotonic() + VIEWER_START_TIMEOUT_S
    while not _listening(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = (proc.stderr.read() if proc.poll() is not None else b"").decode(errors="replace").strip()
            last = err.splitlines()[-1] if err else "no output"
            raise ValueError(f"the Rerun {'server' if serve_port else 'viewer'} did not start on {host}:{port}: "
                             f"{last[:300]}")
        time.sleep(0.1)
    return proc, f"rerun+http://{host}:{port}/proxy"


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def default_blueprint(num_heads: int):
    """The viewer's layout: camera and saliency; actions, reward and cross-track error over
    time; per head tau, logits and the attention by key age."""
    import rerun.blueprint as rrb

    heads = [rrb.Vertical(rrb.TimeSeriesView(origin=f"nac/head{h}/tau", name=f"head {h}: tau"),
                          rrb.TimeSeriesView(origin=f"nac/head{h}/logits", name=f"head {h}: logits"),
                          rrb.BarChartView(origin=f"nac/head{h}/attention", name=f"head {h}: weight by key age"),
                          name=f"head {h}") for h in range(num_heads)]
    drive = rrb.Vertical(rrb.Horizontal(rrb.Spatial2DView(origin="camera", name="camera"),
                                        rrb.Spatial2DView(origin="saliency", name="saliency")),
                         rrb.TimeSeriesView(origin="action", name="actions"),
                         rrb.TimeSeriesView(origin="reward", name="reward"),
                         rrb.TimeSeriesView(origin="cte", name="cross-track error"))
    neurons = rrb.Tabs(*heads, rrb.TimeSeriesView(origin="nac/sensory", name="sensory q/k/v")) if heads else \
        rrb.TimeSeriesView(origin="nac", name="nac")
    return rrb.Blueprint(rrb.Horizontal(drive, neurons, column_shares=[2, 3]), collapse_panels=True)


class Stalled(RuntimeError):
    """A call into the Rerun SDK that did not return in time."""


def _within(seconds: float, call) -> None:
    """``call()``, raising :class:`Stalled` if it has not returned after ``seconds``: once its file
    writer has died (a full disk), Rerun's flush can wait for good, its own timeout notwithstanding."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except RuntimeError as e:
            outcome.append(e)

    worker = threading.Thread(target=run, name="rerun-flush", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():   # the SDK's shutdown at exit would wait on it for good too: the process never ended
        import rerun

        atexit.unregister(rerun.rerun_shutdown)
        raise Stalled(f"Rerun's writer did not answer in {seconds:g} s")
    if outcome:
        raise outcome[0]


# ------------------------------------------------------------------ the step sink
class RerunView:
    """Logs one drive to a Rerun recording, a step at a time (module docstring: the layout).

    Images and the attention bar charts are logged as each step comes; the scalar series are
    sent in columns every ``flush_every`` steps (one call per entity instead of one per step
    and entity: the difference between ~7 ms and well under 1 ms a step), so a viewer is at
    most that many steps behind.

    Args:
        recording: a ``rerun.RecordingStream`` already connected to its sinks (:func:`open_view`).
        saliency: whether the driver should compute the Grad-CAM overlay of each step
            (:meth:`add`'s ``saliency``); the view itself only logs what it is given.
        viewer: the server process to stop on :meth:`close` (``--rerun-serve``), if any.
        where: where the recording goes, in words.
        file: the ``.rrd`` file it writes, if any: removed if the recording fails.

    A recording that fails (a full disk: Rerun's file writer ends) does not end the drive: the
    view stops logging, removes its partial file and says why in :attr:`failure`, which the
    drive reports after its summary.
    """

    def __init__(self, recording, saliency: bool = True, viewer: subprocess.Popen | None = None,
                 where: str = "", flush_every: int = 10, file: str | os.PathLike | None = None):
        self.rec, self.saliency, self.viewer, self.where = recording, saliency, viewer, where
        self.file = None if file is None else Path(file)
        self.failure: str | None = None   # why the recording stopped, once it has
        self.flush_every = flush_every
        self.steps = 0             # the run's next step index (trace row)
        self._episode = -1
        self._episode_step = 0
        self._nac_steps = 0        # NAC traces seen this episode: the layer's step counter
        self._return = 0.0
        self._series: dict[str, list[tuple[int, int, int, np.ndarray]]] = {}

    def new_episode(self) -> None:
        """Call when the policy resets (as :meth:`RunRecorder.new_episode`)."""
        if self._episode < 0 or self._episode_step > 0:
            self._episode += 1
        self._episode_step, self._nac_steps, self._return = 0, 0, 0.0

    def add(self, frame: np.ndarray, policy_action, expert_action=None, reward: float | None = None,
            cross_track_error: float | None = None, nac_trace=None, timestamp: float | None = None,
            saliency: np.ndarray | None = None) -> None:
        """Log one step: the arguments of :meth:`RunRecorder.add`, and ``saliency``, the
        overlay image uint8 RGB ``[H, W, 3]`` (or None)."""
        import rerun as rr

        if self.failure is not None:
            return
        if self._episode < 0:
            self.new_episode()
        nac = None
        if nac_trace is not None:
            nac = reduce_nac_trace(nac_trace, self._nac_steps)
            self._nac_steps += 1
        self._time()
        self.rec.log("camera", rr.Image(np.ascontiguousarray(frame)).compress(jpeg_quality=JPEG_QUALITY))
        if saliency is not None:
            self.rec.log("saliency", rr.Image(saliency).compress(jpeg_quality=JPEG_QUALITY))
        self._values(policy_action, expert_action, reward, cross_track_error, nac)

    def flush(self) -> None:
        """Send the buffered scalar series."""
        import rerun as rr

        if self.failure is not None:
            return
        try:
            for entity, rows in self._series.items():
                if not rows:
                    continue
                steps, episodes, episode_steps, values = zip(*rows)
                indexes = [rr.TimeColumn("step", sequence=steps), rr.TimeColumn("episode", sequence=episodes),
                           rr.TimeColumn("episode_step", sequence=episode_steps)]
                column = rr.Scalars.columns(scalars=np.concatenate(values)).partition([len(v) for v in values])
                self.rec.send_columns(entity, indexes=indexes, columns=column)
                rows.clear()
            _within(FLUSH_TIMEOUT_S, self.rec.flush)
        except RuntimeError as e:   # the SDK's error for a sink that failed ("File-writer thread shut down ...")
            self._fail(e)

    def _fail(self, error: RuntimeError) -> None:
        """Stop logging, remove the partial file and say why in :attr:`failure`."""
        full = self.file is not None and shutil.disk_usage(self.file.parent).free < FULL_DISK_BYTES
        why = "the disk is full" if full else " ".join(str(error).split())[:200]
        self.failure = f"the recording to {self.where} failed ({why})"
        if not isinstance(error, Stalled):   # a stalled writer would stall this too
            try:
                _within(FLUSH_TIMEOUT_S, self.rec.disconnect)
            except RuntimeError:
                pass   # the failure above is the one to report
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            self.failure += "; the partial file was removed"

    def close(self) -> None:
        """Flush and end the recording; stop a gRPC server this view started."""
        self.flush()
        if self.failure is None:
            try:
                _within(FLUSH_TIMEOUT_S, self.rec.disconnect)     # a file gets its footer
            except RuntimeError as e:
                self._fail(e)
        if self.viewer is not None and self.viewer.poll() is None:
            self.viewer.terminate()
            try:
                self.viewer.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.viewer.kill()

    # -- shared by the live view and the replay of a trace
    def _time(self) -> None:
        """Set the current step's time on the three timelines (for the immediate logs)."""
        self.rec.set_time("step", sequence=self.steps)
        self.rec.set_time("episode", sequence=self._episode)
        self.rec.set_time("episode_step", sequence=self._episode_step)

    def _scalars(self, entity: str, values) -> None:
        self._series.setdefault(entity, []).append((self.steps, self._episode, self._episode_step, _floats(values)))

    def _values(self, policy_action, expert_action, reward, cte, nac: dict[str, np.ndarray] | None) -> None:
        """Everything but the images, for the current step; then the step is done."""
        self._scalars("action/policy", policy_action)
        if expert_action is not None and np.isfinite(_floats(expert_action)).any():
            self._scalars("action/expert", expert_action)
        if reward is not None and np.isfinite(reward):
            self._return += float(reward)
            self._scalars("reward/frame", reward)
            self._scalars("reward/return", self._return)
        if cte is not None and np.isfinite(cte):
            self._scalars("cte", cte)
        if nac is not None:
            self._nac(nac)
        self.steps += 1
        self._episode_step += 1
        if self.steps % self.flush_every == 0:
            self.flush()

    def _nac(self, nac: dict[str, np.ndarray]) -> None:
        import rerun as rr

        for gate in ("q", "k", "v"):
            self._scalars(f"nac/sensory/{gate}", nac[gate])
        ages = nac["key_age"]                                                     # [H, K], -1 empty
        for h in range(ages.shape[0]):
            head = f"nac/head{h}"
            for group in BACKBONE_GROUPS:
                self._scalars(f"{head}/{group}", nac[f"{group}_mean"][h])
                self._scalars(f"{head}/{group}_top", nac[f"{group}_top"][h])
            for name in PER_KEY:
                self._scalars(f"{head}/{name}", nac[name][h])
            valid = ages[h] >= 0
            self._scalars(f"{head}/key_age", np.where(valid, ages[h], np.nan))
            by_age = np.zeros(int(ages[h].max()) + 1 if valid.any() else 0)
            np.add.at(by_age, ages[h][valid], nac["weights"][h][valid])
            self.rec.log(f"{head}/attention", rr.BarChart(by_age))


def _floats(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def open_view(file: str | os.PathLike | None = None, *, viewer: bool = False, serve_port: int | None = None,
              num_heads: int = 0, saliency: bool = True, name: str = "drive") -> RerunView:
    """A :class:`RerunView` whose recording goes to one of: ``file`` (a ``.rrd`` path),
    ``viewer`` (a native Rerun viewer started for it) or ``serve_port`` (a Rerun gRPC server on
    127.0.0.1 at that port while the drive lasts; it also keeps what it got for viewers that
    connect late), or a file and one of the others. ``num_heads``: the NAC's heads, for the
    default layout."""
    rr = require_rerun()
    if file is None and not viewer and serve_port is None:
        raise ValueError("open_view: give a .rrd file, viewer=True or a serve_port")
    if viewer and serve_port is not None:
        raise ValueError("--rerun-serve: a viewer started for the drive already serves it; give one of the two")
    if file is not None:
        check_rrd_path(file)
    rec = rr.RecordingStream(APPLICATION_ID, recording_id=f"{name}-{time.strftime('%Y%m%dT%H%M%S')}")
    sinks, where, process = [], [], None
    if file is not None:
        sinks.append(rr.FileSink(str(file)))
        where.append(str(file))
    if viewer or serve_port is not None:
        process, url = start_viewer(serve_port)
        sinks.append(rr.GrpcSink(url))
        where.append(f"{url} (rerun --connect {url})" if serve_port is not None else "the Rerun viewer")
    rec.set_sinks(*sinks, default_blueprint=default_blueprint(num_heads))
    # A native viewer is the user's window, left open; a server serves while the drive lasts.
    return RerunView(rec, saliency=saliency, viewer=process if serve_port is not None else None,
                     where=" and ".join(where), file=file)


def check_rrd_path(path: str | os.PathLike, flag: str = "--rerun", overwrite: bool = True) -> Path:
    """A writable ``.rrd`` path, or a one-line ValueError naming ``flag`` (checked before any work);
    ``overwrite=False`` also refuses an existing file."""
    path = Path(path)
    if path.suffix != ".rrd":
        raise ValueError(f"{flag}: expected a file name ending in .rrd, got {str(path)!r}")
    if path.is_dir() or not path.parent.is_dir():
        raise ValueError(f"{flag}: cannot write {path} (it is a folder, or its folder does not exist)")
    if path.exists() and not path.is_file():   # a FIFO would block the writer with no word
        raise ValueError(f"{flag}: {path} is not a regular file (a FIFO or a device); a recording is written to a "
                         "file of its own")
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(f"{flag}: {path} exists; a drive never overwrites a recording: remove it or name "
                              "another file")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag}: {path} is not writable")
    return path


# ------------------------------------------------------------------ a recorded run, replayed
def trace_to_rrd(run: RunTrace, out: str | os.PathLike, saliency=None, progress: bool = True) -> Path:
    """Write the recording :class:`RerunView` makes live for the run recorded in ``run``
    (and its :class:`~nac_drive.interpret.saliency.RunSaliency`, if given) to ``out``."""
    from tqdm import tqdm

    import rerun as rr

    info = run.metadata.get("nac") or {}
    view = open_view(out, num_heads=int(info.get("num_heads", 0)), name=Path(run.path).parent.name)
    starts = np.r_[True, run.episode[1:] != run.episode[:-1]]
    has_expert = run.expert_action.shape[1] > 0
    for i in tqdm(range(run.num_steps), desc="rrd", unit="step", disable=not progress):
        if view.failure is not None:
            break
        if starts[i]:
            view.new_episode()
        view._time()
        view.rec.log("camera", rr.EncodedImage(contents=run.frame_jpeg(i), media_type="image/jpeg"))
        if saliency is not None:
            view.rec.log("saliency", rr.EncodedImage(contents=saliency.overlay_bytes(i), media_type="image/jpeg"))
        nac = _trace_row(run, i) if run.has_nac[i] else None
        view._values(run.policy_action[i], run.expert_action[i] if has_expert else None,
                     float(run.reward[i]) if np.isfinite(run.reward[i]) else None,
                     float(run.cross_track_error[i]), nac)
    view.close()
    if view.failure is not None:
        raise OSError(f"--rrd: {view.failure}")
    return Path(out)


def _trace_row(run: RunTrace, i: int) -> dict[str, np.ndarray]:
    """Step ``i`` of a trace as :func:`reduce_nac_trace` returns it."""
    return {name: getattr(run, name)[i] for name in NAC_FIELDS}


__all__ = ["RerunView", "open_view", "start_viewer", "trace_to_rrd", "default_blueprint", "require_rerun",
           "check_rrd_path"]
