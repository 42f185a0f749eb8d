"""The evaluation protocol's figures (simulators/episode_stats.py): known answers, the
degenerate cases, and the keys ``drive carracing`` and ``expert eval`` print."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import norm

from nac_drive.simulators.carracing import EVAL_SEED_BASE, EpisodeResults, eval_seeds
from nac_drive.simulators.episode_stats import (SUCCESS_RETURN, format_return_stats, mean_interval, return_stats,
                                                success_interval)

NEW_KEYS = ("mean_ci95", "worst_return", "success_threshold", "successes", "success_rate", "success_ci95")


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval by its formula (Wilson 1927), independent of scipy's."""
    z = norm.ppf(0.5 + confidence / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_success_threshold_is_the_envs_solved():
    assert SUCCESS_RETURN == 900


@pytest.mark.parametrize("k, n", [(20, 20), (14, 20), (0, 3), (1, 1), (57, 100)])
def test_wilson_interval_matches_the_formula(k, n):
    assert success_interval(k, n) == pytest.approx(wilson(k, n), abs=1e-9)


def test_all_successes():
    stats = return_stats([910.0] * 20)
    assert stats["success_rate"] == 1.0 and stats["successes"] == 20 and stats["episodes"] == 20
    assert stats["success_ci95"] == pytest.approx(wilson(20, 20), abs=1e-4)
    assert stats["success_ci95"][0] == pytest.approx(0.8389, abs=1e-4)   # 20/20 does not prove 100%
    assert stats["worst_return"] == 910.0
    assert stats["mean_ci95"] == [910.0, 910.0]   # all equal: every resample has that mean


def test_success_counts_returns_at_or_above_the_threshold():
    stats = return_stats([900.0, 899.99, 950.0, -50.0])
    assert stats["successes"] == 2 and stats["success_rate"] == 0.5
    assert return_stats([850.0, 899.0], success_at=800)["success_rate"] == 1.0
    assert return_stats([850.0, 899.0], success_at=800)["success_threshold"] == 800


def test_worst_and_mean():
    returns = [883.0, 716.0, 905.5, 912.0]
    stats = return_stats(returns)
    assert stats["worst_return"] == 716.0
    assert stats["mean_return"] == pytest.approx(np.mean(returns))
    assert stats["std_return"] == pytest.approx(np.std(returns))


def test_bootstrap_interval_contains_the_mean_and_narrows_with_n():
    rng = np.random.default_rng(0)
    widths = []
    for n in (10, 100, 1000):
        returns = rng.normal(850, 60, n)
        lo, hi = mean_interval(returns)
        assert lo < returns.mean() < hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    # about 2 x 1.96 x sigma / sqrt(n) for n = 1000
    assert widths[2] == pytest.approx(2 * 1.96 * 60 / math.sqrt(1000), rel=0.2)


def test_bootstrap_interval_is_reproducible():
    returns = np.random.default_rng(1).normal(800, 100, 30)
    assert mean_interval(returns) == mean_interval(returns.copy())


def test_one_episode_has_no_interval_of_the_mean():
    assert all(math.isnan(v) for v in mean_interval([905.0]))
    stats = return_stats([905.0])
    assert stats["mean_ci95"] is None   # JSON null, never NaN
    assert stats["worst_return"] == 905.0 and stats["success_rate"] == 1.0
    assert stats["success_ci95"] == pytest.approx(wilson(1, 1), abs=1e-4)
    text = format_return_stats(stats)
    assert "95% CI" not in text and ">= 900: 1/1 = 100%" in text


def test_no_episodes():
    stats = return_stats([])
    assert stats["episodes"] == 0 and stats["successes"] == 0
    assert math.isnan(stats["mean_return"])
    assert stats["success_rate"] is stats["worst_return"] is stats["mean_ci95"] is stats["success_ci95"] is None
    assert format_return_stats(stats) == "return nan"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_return_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        return_stats([900.0, bad])


def test_format_shows_every_figure():
    stats = return_stats([910.0] * 14 + [716.0, 850.0, 880.0, 890.0, 800.0, 860.0])
    text = format_return_stats(stats)
    lo, hi = stats["mean_ci95"]
    assert text.startswith(f"return {stats['mean_return']:.1f} +- {stats['std_return']:.1f} "
                           f"(95% CI {lo:.1f}-{hi:.1f}), worst 716.0")
    assert text.endswith(">= 900: 14/20 = 70% (Wilson 48-85%)")


def test_episode_results_summary_keeps_its_keys_and_adds_the_protocol():
    results = EpisodeResults(seeds=[1, 2, 3], returns=[910.0, 883.0, 716.0], lengths=[1000, 1000, 400],
                             laps=[True, False, False], latencies_ms=[1.0, 2.0])
    summary = results.summary()
    for key in ("mean_return", "std_return", "episodes", "laps_finished", "laps", "seeds", "returns", "lengths",
                "latency_ms_p50", "latency_ms_p95", *NEW_KEYS):
        assert key in summary, key
    assert summary["successes"] == 1 and summary["worst_return"] == 716.0
    assert ">= 900: 1/3 = 33%" in results.format()


def test_headline_tracks_are_900000_to_900099():
    assert eval_seeds(100) == list(range(900_000, 900_100)) and EVAL_SEED_BASE == 900_000


def _refuse_nan(name):
    raise AssertionError(f"{name} in the JSON line: not JSON")


def _cli_json(*args, episodes: int = 2, cwd=None) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", *args, "--episodes", str(episodes),
                          "--max-steps", "50", "--json"], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1], parse_constant=_refuse_nan), "\n".join(lines[:-1])


@pytest.mark.parametrize("verb", [("drive", "carracing"), ("expert", "eval", "--expert", "teacher")])
def test_cli_prints_the_protocol(verb):
    summary, text = _cli_json(*verb)
    returns = np.asarray(summary["returns"])
    assert summary["seeds"] == [EVAL_SEED_BASE, EVAL_SEED_BASE + 1]
    assert summary["worst_return"] == pytest.approx(returns.min(), abs=0.01)
    assert summary["success_threshold"] == 900
    assert summary["success_rate"] == np.mean(returns >= 900) and summary["successes"] == int(np.sum(returns >= 900))
    lo, hi = summary["mean_ci95"]
    assert lo <= summary["mean_return"] <= hi
    assert summary["success_ci95"] == pytest.approx(wilson(summary["successes"], 2), abs=1e-4)
    assert f"(95% CI {lo:.1f}-{hi:.1f}), worst {summary['worst_return']:.1f}" in text
    assert f">= 900: {summary['successes']}/2" in text


def test_quickstart_of_one_track_prints_the_protocol_as_json(tmp_path):
    """As CI runs it: one track, so no interval of the mean (null), the rest there."""
    summary, text = _cli_json("quickstart", "--no-saliency", "--out", str(tmp_path / "qs"), episodes=1,
                              cwd=tmp_path)
    assert summary["episodes"] == 1 and summary["mean_ci95"] is None
    assert summary["worst_return"] == pytest.approx(summary["returns"][0], abs=0.01)
    assert summary["successes"] == int(summary["returns"][0] >= 900)
    assert summary["success_ci95"] == pytest.approx(wilson(summary["successes"], 1), abs=1e-4)
    assert f"worst {summary['worst_return']:.1f}, >= 900: {summary['successes']}/1" in text


def test_a_paired_change_is_the_mean_difference_with_an_interval_the_track_spread_does_not_widen():
    from nac_drive.simulators.episode_stats import paired_change

    rng = np.random.default_rng(0)
    reference = rng.uniform(300, 930, 20)                  # tracks that differ by hundreds
    treated = reference - 10 + rng.normal(0, 2, 20)        # each one 10 lower, give or take 2
    change = paired_change(reference, treated)
    assert change["mean"] == pytest.approx(np.mean(treated - reference))
    lo, hi = change["ci95"]
    assert -12 < lo < change["mean"] < hi < -8             # an unpaired interval would span ~+-150
    assert paired_change([1.0], [3.0]) == {"mean": 2.0, "ci95": None}
    with pytest.raises(ValueError, match="one value per episode"):
        paired_change([1.0, 2.0], [1.0])


def test_episode_time_blocks_cut_each_episode_into_stretches():
    from nac_drive.simulators.episode_stats import episode_time_blocks

    blocks = episode_time_blocks([0, 0, 0, 0, 0, 1, 1, 1, 0, 0], 2)
    assert blocks.tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 5, 5]   # a label seen again later is a new stretch


def test_a_block_bootstrap_interval_holds_a_known_auroc_and_needs_two_blocks():
    from nac_drive.interpret.fig4 import auroc
    from nac_drive.simulators.episode_stats import block_bootstrap_interval

    rng = np.random.default_rng(1)
    labels = np.tile([True, False], 200)
    scores = rng.normal(size=400) + labels                      # AUROC ~0.76
    blocks = np.arange(400) // 20
    statistic = lambda i: [auroc(scores[i], labels[i]), auroc(-scores[i], labels[i])]   # noqa: E731
    (lo, hi), (lo_neg, hi_neg) = block_bootstrap_interval(statistic, blocks, 300)
    whole = auroc(scores, labels)
    assert lo < whole < hi and 0.5 < lo and hi - lo < 0.2
    assert (lo_neg, hi_neg) == pytest.approx((1 - hi, 1 - lo), abs=1e-9)
    assert np.isnan(block_bootstrap_interval(statistic, np.zeros(400), 50)).all()


def test_format_estimate_writes_the_interval_in_the_values_format_and_leaves_out_a_missing_one():
    from nac_drive.simulators.episode_stats import format_estimate, format_interval

    assert format_estimate(883.21, [861.04, 903.36]) == "883.2 [861.0, 903.4]"
    assert format_estimate(0.5, [-0.25, 1.0], "+.2f") == "+0.50 [-0.25, +1.00]"
    assert format_estimate(12.0, None) == "12.0"
    assert format_interval(None) == "-"


def test_a_crossed_paired_change_counts_a_run_that_drives_worse_everywhere_once_not_per_track():
    from nac_drive.simulators.episode_stats import crossed_paired_change, paired_change

    rng = np.random.default_rng(0)
    tracks = rng.uniform(300, 900, size=20)                     # hard and easy tracks, shared by every run
    reference = tracks + rng.normal(0, 5, size=(3, 20))
    # three treated runs: +40, +10 and -20 on every track (a good, a middling and a poor seed), mean +10
    treated = tracks + np.array([[40.0], [10.0], [-20.0]]) + rng.normal(0, 5, size=(3, 20))
    crossed = crossed_paired_change(reference, treated)
    assert crossed["mean"] == pytest.approx(treated.mean() - reference.mean())
    assert (crossed["tracks"], crossed["runs"]) == (20, [3, 3]) and 2 <= crossed["df"] < 3   # the seeds' term rules
    lo, hi = crossed["ci95"]
    assert lo < -20 and hi > 40   # three seeds 30 apart: t(~2) x 17.3
    pooled = paired_change(reference.reshape(-1), treated.reshape(-1))["ci95"]   # the 60 pairs as independent
    assert hi - lo > 5 * (pooled[1] - pooled[0])
    # the tracks' spread cancels: one run each side, a steady +10 with small noise, is a narrow interval
    steady = crossed_paired_change(reference[:1], reference[:1] + 10 + rng.normal(0, 1, size=(1, 20)))
    assert steady["ci95"][0] > 9 and steady["ci95"][1] < 11
    assert crossed_paired_change([[1.0]], [[2.0]])["ci95"] is None
    assert crossed_paired_change([[1.0, 2.0]], [[3.0, 4.0]])["ci95"] == [2.0, 2.0]   # no spread seen
    with pytest.raises(ValueError, match="the same tracks, got \\[3, 20\\] and \\[3, 19\\]"):
        crossed_paired_change(reference, treated[:, :19])
    with pytest.raises(ValueError, match="expected finite values"):
        crossed_paired_change(reference, np.where(treated > 0, np.nan, treated))


def test_a_crossed_paired_interval_holds_the_true_difference_95_times_in_100_with_three_seeds():
    """Simulated comparisons of two cores that drive alike: each seed a run-wide offset (SD 30),
    each track a difficulty shared by both (SD 100) and a core-specific part (SD 20), each
    (seed, track) noise (SD 60). A bootstrap over 3 seeds covered ~78% (it cannot reach past
    the seeds' own spread); the t-interval must cover at least 90% of 300."""
    from nac_drive.simulators.episode_stats import crossed_paired_change

    rng = np.random.default_rng(1)

    def core(shared):
        return shared + rng.normal(0, 30, (3, 1)) + rng.normal(0, 20, 20) + rng.normal(0, 60, (3, 20))

    held = 0
    for _ in range(300):
        shared = rng.normal(0, 100, 20)
        lo, hi = crossed_paired_change(core(shared), core(shared))["ci95"]
        held += lo <= 0 <= hi
    assert held >= 270
