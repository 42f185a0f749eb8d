"""Each perturbation of ``--perturb`` makes the frames it promises (issue 42): the bars are
black and leave the rest alone, the colour shift recolours the grass and not the car or the
road, the noise has the stated std and repeats with the seed, the patch has the stated size,
domain-randomize is gymnasium's own; the parser refuses nonsense in one line; the spec
rebuilds the perturbed env; ``drive carracing --perturb`` names its perturbation in its JSON."""

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from scipy.ndimage import binary_dilation, binary_erosion

from nac_drive.simulators.carracing import GAS, LEFT, make_carracing
from nac_drive.simulators.perturbations import (BLOB_RGB, INDICATOR_ROWS, PERTURBATIONS, apply_perturbation,
                                                parse_perturbation, perturbation_record)

SEED = 900_003
ACTIONS = [GAS] * 30 + [LEFT] * 10 + [GAS] * 20   # 60 frames: past the opening zoom, the car turning


def frames(perturb: str | None, seed: int = SEED, env: gym.Env | None = None) -> list[np.ndarray]:
    """The frames of an episode on track ``seed`` under ``perturb``, for ``ACTIONS``."""
    env = make_carracing(perturb=perturb) if env is None else env
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for action in ACTIONS:
        out.append(env.step(action)[0])
    env.close()
    return out


@pytest.fixture(scope="module")
def clean() -> list[np.ndarray]:
    return frames(None)


def test_side_bars_are_black_and_the_middle_is_the_plain_frame(clean):
    width = 12
    for plain, barred in zip(clean, frames(f"side-bars={width}")):
        assert (barred[:, :width] == 0).all() and (barred[:, -width:] == 0).all()
        assert np.array_equal(barred[:, width:-width], plain[:, width:-width])
    assert clean[-1][:, :width].any()   # there was something to black out
    # the default: CarRacingBar-v0's 3/40 of the width
    assert parse_perturbation("side-bars") == ("side-bars", 7)
    assert (frames("side-bars")[-1][:, :7] == 0).all()


def test_the_colour_shift_recolours_the_grass_and_not_the_car_or_the_road(clean):
    shift = -51
    for plain, shifted in list(zip(clean, frames(f"colour={shift}")))[35:51:5]:   # the car in full view
        rgb = plain.astype(int)
        field = rgb[..., 1] - rgb[..., 0] > 60   # background and grass patches: green (not the bar's green gauge)
        field[-INDICATOR_ROWS:] = False
        inside = binary_erosion(field, iterations=1)
        assert inside.sum() > 1000
        change = shifted[inside].astype(int) - rgb[inside]
        assert (np.abs(change - shift) <= 2).all()   # every channel shifted (the frame is resampled: +-2)
        # the road and the car, away from any pixel that the grass tints (antialiased edges), are as they were
        near_field = binary_dilation(rgb[..., 1] - rgb[..., 2] > 15, iterations=2)
        car = (rgb[..., 0] > 150) & (rgb[..., 1] < 80) & (rgb[..., 2] < 80)
        road = (np.abs(rgb - 102).max(-1) <= 8) & (np.ptp(rgb, -1) <= 6)
        assert (car & ~near_field).sum() >= 15 and (road & ~near_field).sum() > 500
        assert np.array_equal(shifted[~near_field], plain[~near_field])
        assert np.array_equal(shifted[-INDICATOR_ROWS:], plain[-INDICATOR_ROWS:])   # the indicator bar


def test_noise_has_the_stated_std_and_repeats_with_the_seed(clean):
    std = 20
    noisy = frames(f"noise={std}")
    diffs = np.stack([n.astype(int) - c for n, c in zip(noisy, clean)])
    away_from_clipping = np.stack([(c >= 5 * std) & (c <= 255 - 5 * std) for c in clean])
    d = diffs[away_from_clipping]
    assert d.size > 100_000
    assert abs(d.std() - std) < 0.03 * std and abs(d.mean()) < 0.2
    assert abs(np.abs(d).mean() - std * np.sqrt(2 / np.pi)) < 0.05 * std   # Gaussian: E|x| = std sqrt(2/pi)
    again = frames(f"noise={std}")
    assert all(np.array_equal(a, b) for a, b in zip(noisy, again))
    other = frames(f"noise={std}", seed=SEED + 1)[0].astype(int) - frames(None, seed=SEED + 1)[0]
    assert not np.array_equal(other, diffs[0])   # another track, another stream


def test_the_occluding_patch_has_the_stated_size_and_hides_nothing_else(clean):
    size = 20
    env = make_carracing(perturb=f"occlusion={size}")
    occluded = frames(None, env=env)
    row, col = env.corner
    assert 0 <= row and row + size <= 96 - INDICATOR_ROWS and 0 <= col and col + size <= 96
    patch = np.zeros((96, 96), bool)
    patch[row:row + size, col:col + size] = True
    for plain, seen in zip(clean, occluded):
        assert (seen[patch] == BLOB_RGB).all()
        assert np.array_equal(seen[~patch], plain[~patch])
    corners = set()
    for seed in range(SEED, SEED + 4):
        env = make_carracing(perturb="occlusion")
        env.reset(seed=seed)
        corners.add(env.corner)
        env.reset(seed=seed)
        assert env.corner in corners   # the same seed, the same place
    assert len(corners) > 1   # the place is drawn per track


def test_domain_randomize_is_gymnasiums_and_recolours_the_frame(clean):
    env = make_carracing(perturb="domain-randomize")
    assert env.unwrapped.domain_randomize is True and env.spec.kwargs["domain_randomize"] is True
    env.reset(seed=SEED)
    plain = make_carracing()
    assert not np.allclose(env.unwrapped.bg_color, plain.unwrapped.bg_color)
    assert not np.allclose(env.unwrapped.road_color, plain.unwrapped.road_color)
    plain.close()
    randomised = frames(None, env=env)
    assert (np.abs(randomised[-1].astype(int) - clean[-1]).max(-1) > 10).mean() > 0.5
    assert all(np.array_equal(a, b) for a, b in zip(randomised, frames("domain-randomize")))   # seeded


@pytest.mark.parametrize("perturb", ["colour=30", "side-bars=9", "noise=10", "occlusion=12", "domain-randomize"])
def test_the_spec_rebuilds_the_perturbed_env(perturb):
    env = make_carracing(perturb=perturb)
    rebuilt = gym.make(env.spec)
    assert env.spec.additional_wrappers == rebuilt.spec.additional_wrappers
    assert all(np.array_equal(a, b) for a, b in zip(frames(None, env=env)[:20], frames(None, env=rebuilt)[:20]))


def test_the_parser_and_its_errors():
    assert parse_perturbation("side-bars=12") == ("side-bars", 12)
    assert parse_perturbation("colour=-30") == ("colour", -30)
    assert parse_perturbation("domain-randomize") == ("domain-randomize", None)
    assert {name: parse_perturbation(name)[1] for name in PERTURBATIONS} == {
        "colour": -51, "side-bars": 7, "noise": 25, "occlusion": 16, "domain-randomize": None, "frame-drop": 0.25}
    assert perturbation_record("noise=3") == {"name": "noise", "level": 3} and perturbation_record(None) is None
    with pytest.raises(ValueError, match="^unknown perturbation 'fog'; known: colour, side-bars, noise, occlusion, "
                                         "domain-randomize, frame-drop$"):
        parse_perturbation("fog=3")
    with pytest.raises(ValueError, match=r"^side-bars: the level must be an integer in 1\.\.47, got 48$"):
        parse_perturbation("side-bars=48")
    with pytest.raises(ValueError, match=r"^noise: the level must be an integer in 1\.\.255, got 'lots'$"):
        parse_perturbation("noise=lots")
    with pytest.raises(ValueError, match="^domain-randomize takes no level"):
        parse_perturbation("domain-randomize=2")
    with pytest.raises(ValueError, match="make the env with gymnasium's domain_randomize"):
        apply_perturbation(make_carracing(), "domain-randomize")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nac_drive.cli", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONSAFEPATH="1"))


def test_drive_and_expert_eval_take_perturb_and_report_it():
    for verb in (["drive", "carracing"], ["expert", "eval"]):
        assert "--perturb NAME[=LEVEL]" in cli(*verb, "--help").stdout
    refused = cli("expert", "eval", "--perturb", "fog")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].endswith("--perturb: unknown perturbation 'fog'; known: colour, "
                                                            "side-bars, noise, occlusion, domain-randomize")
    udacity = cli("drive", "udacity", "--perturb", "noise")   # the emulator's frames are not CarRacing's
    assert udacity.returncode == 2 and udacity.stderr.strip().splitlines()[-1].endswith(
        "--perturb: noise does not apply here; this takes frame-drop")
    done = cli("drive", "carracing", "--episodes", "1", "--max-steps", "50", "--perturb", "side-bars", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["perturbation"] == {"name": "side-bars", "level": 7} and summary["lengths"] == [50]
