"""`nac-drive drive udacity --trace`: a PilotNet+NAC policy through the bridge, traced for the dashboard."""

import sys

import numpy as np
import pytest

from nac_drive.interpret.trace import load_trace
from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator
from support.udacity_procs import Proc, free_port
from support.udacity_test_policies import untrained_udacity_policy


@pytest.mark.slow
def test_drive_udacity_with_a_checkpoint_records_the_nac_trace(tmp_path):
    checkpoint = untrained_udacity_policy().save_pretrained(tmp_path / "policy")
    port, run = free_port(), tmp_path / "run"
    bridge = Proc([sys.executable, "-m", "nac_drive.cli", "drive", "udacity", "--policy", str(checkpoint),
                   "--port", str(port), "--trace", str(run), "--json"])
    bridge.wait_for("listening on", timeout=60)
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=40, track="gentle"))
    finally:
        assert bridge.stop() == 0
    summary = bridge.json_summary()
    assert report.telemetry_sent == 40 and summary["answered"] == summary["messages"] >= 40
    trace = load_trace(run)
    # every answered frame was traced (the emulator also answers the connect command's frame)
    assert trace.num_steps == summary["answered"]
    assert trace.frame(0).shape == (160, 320, 3)
    assert trace.q.shape == (trace.num_steps, 64) and trace.has_nac.all()
    steering = trace.policy_action[:, 0]
    assert np.all(np.abs(steering) <= 1.0) and np.isfinite(steering).all()
    assert trace.key_age.max() == 15          # the window of 16 frames filled up

    # Grad-CAM for the run: the overlay covers only the rows the model sees (60:-25)
    from nac_drive.interpret.policy_saliency import policy_saliency
    from nac_drive.interpret.saliency import load_saliency
    from nac_drive.policy.driving_policy import DrivingPolicy

    policy_saliency(DrivingPolicy.from_pretrained(checkpoint), run, progress=False)
    sal = load_saliency(run, trace)
    frame, over = trace.frame(5).astype(float), sal.overlay(5).astype(float)
    assert np.abs(frame[:60] - over[:60]).mean() < 4 and np.abs(frame[-25:] - over[-25:]).mean() < 4
    assert np.abs(frame[60:-25] - over[60:-25]).mean() > 10
