"""Videos browsers play: VP8 WebM from `drive --video`, read back by OpenCV and by the
container reader, and played by the dashboard beside the run's traces (headless Chromium)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from support.dashboard_pages import chromium_dashboard_page, run_data

from nac_drive.cli import main
from nac_drive.interpret.archive import decode_jpeg
from nac_drive.interpret.dashboard import build_dashboard
from support.synthetic_runs import make_synthetic_run
from nac_drive.interpret.trace import load_trace
from nac_drive.simulators.carracing import FPS, VIDEO_SCALE, run_episodes
from nac_drive.io import video as video_module
from nac_drive.io.video import WebmWriter, read_webm_info

GAS = 3


class _Gas:
    """Always accelerates; keeps the observations it was shown."""

    def __init__(self):
        self.seen = []

    def reset(self):
        pass

    def act(self, obs):
        self.seen.append(obs.copy())
        return GAS


def _decoded_frames(path):
    import cv2

    cap = cv2.VideoCapture(str(path))
    fourcc = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode()
    frames = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            return fourcc, frames
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def test_episodes_are_written_as_vp8_webm_one_frame_per_env_frame(tmp_path):
    path = tmp_path / "run.webm"
    actor = _Gas()
    run_episodes(actor, [5, 6], max_steps=12, video_path=path)
    assert path.read_bytes()[:4] == b"\x1a\x45\xdf\xa3"              # an EBML (Matroska/WebM) file
    fourcc, frames = _decoded_frames(path)
    assert fourcc == "VP80" and len(frames) == 24 == len(actor.seen)
    info = read_webm_info(path)
    side = 96 * VIDEO_SCALE
    assert (info.codec, info.width, info.height, info.fps, info.frames) == ("V_VP8", side, side, FPS, 24)
    # each video frame is the observation the actor saw (upscaled, lossy): not its neighbour's
    upscaled = [np.repeat(np.repeat(o, VIDEO_SCALE, 0), VIDEO_SCALE, 1).astype(float) for o in actor.seen]
    errors = [np.abs(f - upscaled[i]).mean() for i, f in enumerate(frames)]
    assert max(errors) < 4, errors
    assert np.abs(frames[12] - upscaled[11]).mean() > 3 * errors[12]   # the second track's first frame


def test_drive_records_the_first_tracks_and_scores_them_all(tmp_path, capsys):
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing

    every = drive_carracing(DriveArgs(episodes=2, max_steps=6), progress=False)
    assert every["seeds"] == [900_000, 900_001] and every["lengths"] == [6, 6]   # each track driven once
    capsys.readouterr()
    split = drive_carracing(DriveArgs(episodes=3, max_steps=6, video=str(tmp_path / "drive.webm"),
                                      trace=str(tmp_path / "run")), progress=True, recorded=1)
    bars = capsys.readouterr().err   # one bar per part, each saying what it drives
    assert "recorded episodes: 100%" in bars and "other episodes: 100%" in bars and "| 2/2" in bars
    assert split["seeds"] == [900_000, 900_001, 900_002] and split["lengths"] == [6, 6, 6]
    assert split["returns"][:2] == pytest.approx(every["returns"])   # recording changes no action
    assert read_webm_info(tmp_path / "drive.webm").frames == 6 and load_trace(tmp_path / "run").num_steps == 6


def test_a_video_that_is_not_webm_is_refused_before_driving(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"run\.mp4: videos are written as WebM \(VP8\), name the file \*\.webm"):
        run_episodes(_Gas(), [5], max_steps=2, video_path=tmp_path / "run.mp4")
    assert main(["drive", "carracing", "--episodes", "1", "--video", str(tmp_path / "out.mp4"),
                 "--trace", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nac-drive drive: error: video: {tmp_path / 'out.mp4'}: videos are written as WebM (VP8), "
                   f"name the file *.webm"]
    assert not (tmp_path / "run").exists()                              # nothing driven, nothing written


def _webm(tmp_path, frames: list[np.ndarray], name="video.webm", fps=10):
    with WebmWriter(tmp_path / name, fps=fps) as video:
        for f in frames:
            video.write(f)
    return tmp_path / name


def _encoder_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "webm-writer"]


def _greys(n: int, side: int = 16) -> list[np.ndarray]:
    """``n`` (up to 24) flat grey frames, each lighter than the one before (10 levels apart)."""
    return [np.full((side, side, 3), 10 + 10 * i, np.uint8) for i in range(n)]


def test_the_encoder_thread_keeps_every_frame_in_order_and_close_waits_for_it(tmp_path):
    import cv2

    frames = _greys(24)
    video = WebmWriter(tmp_path / "v.webm", fps=10, scale=2)
    for f in frames:
        video.write(f)
    assert len(_encoder_threads()) == 1                   # encoding goes on beside the caller
    video.close()
    assert _encoder_threads() == [] and video.frames == 24
    info = read_webm_info(tmp_path / "v.webm")
    assert (info.frames, info.width, info.height) == (24, 32, 32)
    cap = cv2.VideoCapture(str(tmp_path / "v.webm"))
    levels = []
    while (read := cap.read())[0]:
        levels.append(read[1].mean())
    nearest = np.abs(np.array(levels)[:, None] - [f.mean() for f in frames]).argmin(axis=1)
    assert nearest.tolist() == list(range(24)), levels                  # video frame i is frame i written


def test_a_slow_encoder_holds_the_writer_back_instead_of_queueing_frames(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(video_module, "QUEUE_FRAMES", 2)
    encode, encoded = WebmWriter._encode, []

    def slow(self, rgb):
        time.sleep(0.02)
        encoded.append(rgb is not None)
        return encode(self, rgb)

    monkeypatch.setattr(WebmWriter, "_encode", slow)
    with WebmWriter(tmp_path / "v.webm", fps=10) as video:
        waiting = []
        for f in _greys(12):
            video.write(f)
            waiting.append(video.frames - sum(encoded))
    assert max(waiting) <= 2 + 1, waiting                  # the queue, and the frame being encoded
    assert sum(encoded) == 12 == read_webm_info(tmp_path / "v.webm").frames


def test_an_encoder_error_is_raised_in_the_caller_once_and_the_thread_ends(tmp_path, monkeypatch):
    encode, calls = WebmWriter._encode, []

    def failing(self, rgb):
        calls.append(rgb)
        if len(calls) == 3:
            raise RuntimeError("encoder broke at frame 2")
        return encode(self, rgb)

    monkeypatch.setattr(WebmWriter, "_encode", failing)
    video = WebmWriter(tmp_path / "v.webm", fps=10)
    with pytest.raises(RuntimeError, match="^encoder broke at frame 2$"):
        try:
            for f in _greys(10):
                video.write(f)
        finally:
            video.close()                                  # raises it if no write() did
    video.close()                                          # raised once: closing again is quiet
    assert _encoder_threads() == [] and len(calls) == 3    # nothing encoded after the error, not even the flush


def test_frames_of_another_size_or_type_are_refused_in_one_line(tmp_path):
    video = WebmWriter(tmp_path / "v.webm", fps=10)
    with pytest.raises(ValueError, match=r"v\.webm: frames are uint8 RGB \[H, W, 3\], got float32 \[16, 16, 3\]$"):
        video.write(np.zeros((16, 16, 3), np.float32))
    video.write(np.zeros((16, 16, 3), np.uint8))
    with pytest.raises(ValueError, match=r"v\.webm: frame 1 is uint8 \[16, 17, 3\], the video's frames are "
                                         r"uint8 \[16, 16, 3\]$"):
        video.write(np.zeros((16, 17, 3), np.uint8))
    video.close()
    assert read_webm_info(tmp_path / "v.webm").frames == 1


def test_container_reader_refuses_what_browsers_would_not_play(tmp_path, monkeypatch):
    good = _webm(tmp_path, [np.full((16, 16, 3), 30 * i, np.uint8) for i in range(6)]).read_bytes()
    assert read_webm_info(tmp_path / "video.webm").frames == 6
    cases = {"half.webm": (good[:len(good) // 2], "past its parent"),
             "mkv.webm": (good.replace(b"webm", b"mkv\x00", 1), "document type"),
             "empty.webm": (b"", "no EBML header"),
             "text.webm": (b"<html>" * 10, "bad length field|no EBML header|past its parent")}
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name}: not a readable WebM video \(.*({message})"):
            read_webm_info(tmp_path / name)
    with pytest.raises(ValueError, match="more than the 100 allowed"):
        read_webm_info(tmp_path / "video.webm", max_bytes=100)
    # a picture larger than the reader takes is refused (a cap of 8 a side stands in for 4096)
    monkeypatch.setattr(video_module, "MAX_SIDE", 8)
    with pytest.raises(ValueError, match=r"video\.webm: not a readable WebM video \(picture 16x16, expected 1\.\.8"):
        read_webm_info(tmp_path / "video.webm")


N = 30


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    make_synthetic_run(d, steps=N, seed=3)
    return d


def test_dashboard_embeds_the_runs_video_and_refuses_another_runs(run_dir, tmp_path, capsys):
    run = load_trace(run_dir)
    video = _webm(tmp_path, [run.frame(i) for i in range(N)], name="<b>drive&.webm")
    page = build_dashboard(run_dir, tmp_path / "d.html", video=video).read_text(encoding="utf-8")
    assert "&lt;b&gt;drive&amp;.webm: V_VP8 96x96, 30 frames at 10 fps" in page and "<b>drive" not in page   # the name is text
    data = run_data(page)
    assert base64.b64decode(data["video"]["b64"]) == video.read_bytes()
    assert {k: data["video"][k] for k in ("codec", "frames", "fps")} == {"codec": "V_VP8", "frames": N, "fps": 10}
    # RUN_DIR/video.webm is found without being named; without one the page has no video
    assert run_data(build_dashboard(run_dir, tmp_path / "none.html").read_text(encoding="utf-8"))["video"] is None
    (run_dir / "video.webm").write_bytes(video.read_bytes())
    try:
        assert run_data(build_dashboard(run_dir, tmp_path / "e.html").read_text(encoding="utf-8"))["video"]["frames"] == N
    finally:
        (run_dir / "video.webm").unlink()
    short = _webm(tmp_path, [run.frame(i) for i in range(N - 1)], name="short.webm")
    assert main(["dashboard", str(run_dir), "--video", str(short), "-o", str(tmp_path / "f.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nac-drive dashboard: error: {short}: {N - 1} video frames but the run's trace has {N} steps "
                   f"(not this run's video: drive writes both with --video and --trace)"]
    assert not (tmp_path / "f.html").exists()


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_plays_the_drive_video_in_step_with_the_traces(tmp_path, capsys):
    dashboard_page = chromium_dashboard_page()
    steps = 60
    video, trace = tmp_path / "drive.webm", tmp_path / "run"
    assert main(["drive", "carracing", "--episodes", "1", "--max-steps", str(steps), "--video", str(video),
                 "--trace", str(trace), "--json"]) == 0
    assert f"--video {video}" in capsys.readouterr().out
    run = load_trace(trace)
    assert run.num_steps == steps == read_webm_info(video).frames
    page_path = build_dashboard(trace, video=video)
    with dashboard_page(page_path) as (page, problems):
        page.wait_for_function("window.dashboard.video.readyState >= 2", timeout=10_000)
        media = page.evaluate("() => { const v = window.dashboard.video; "
                              "return {error: v.error, duration: v.duration, width: v.videoWidth}; }")
        assert media["error"] is None and media["width"] == 96 * VIDEO_SCALE and page.locator("#video").is_visible()
        assert media["duration"] == pytest.approx(steps / FPS, abs=1.5 / FPS)

        # scrubbing moves the video to that step: its picture is the trace's frame 40
        page.locator("#scrubber").fill("40")
        page.wait_for_function("Math.abs(window.dashboard.video.currentTime - 40.5 / 50) < 1e-3 "
                               "&& !window.dashboard.video.seeking && window.dashboard.video.readyState >= 2")
        picture = np.array(page.evaluate("""() => {
            const v = window.dashboard.video, c = document.createElement('canvas');
            c.width = 96; c.height = 96;
            const g = c.getContext('2d'); g.imageSmoothingEnabled = false;
            g.drawImage(v, 0, 0, 96, 96);
            return Array.from(g.getImageData(0, 0, 96, 96).data); }"""), dtype=float).reshape(96, 96, 4)[..., :3]
        errors = {i: np.abs(picture - decode_jpeg(run.frame_jpeg(i)).astype(float)).mean() for i in (40, 20)}
        assert errors[40] < 6 and errors[20] > 2 * errors[40], errors

        # playing the video moves the scrubber and every panel's cursor with it
        page.evaluate("window.dashboard.setFrame(0)")
        page.wait_for_function("window.dashboard.video.currentTime < 0.05 && !window.dashboard.video.seeking")
        page.evaluate("window.dashboard.video.play()")
        page.wait_for_function("window.dashboard.state.frame >= 15", timeout=10_000)
        page.evaluate("window.dashboard.video.pause()")
        # paused, the scrubber and the cursors stand on the frame the video shows
        page.wait_for_function(f"window.dashboard.state.frame === Math.floor(window.dashboard.video.currentTime * {FPS}"
                               f" + 1e-6) && document.getElementById('cursor-actions').dataset.frame === "
                               f"document.getElementById('scrubber').value && document.getElementById('scrubber')"
                               f".value === String(window.dashboard.state.frame)")
        assert page.evaluate("window.dashboard.video.getVideoPlaybackQuality().totalVideoFrames") >= 15
        assert problems == []
