"""The evaluation protocol's figures of a run's episode returns: the mean with its 95%
bootstrap interval, the worst episode, and the success rate (return >= 900, the score
CarRacing calls "solved") with its 95% Wilson interval.

Every command that scores on CarRacing (``drive carracing``, ``expert eval``, ``quickstart``)
reports them through :meth:`~nac_drive.simulators.carracing.EpisodeResults.summary`, which
calls :func:`return_stats`. Headline figures are over the 100 held-out tracks
900000-900099 (``--episodes 100``); the intervals say how far a mean over fewer can be
from it.

:func:`block_mean_interval`, :func:`paired_block_change` and :func:`block_bootstrap_interval` serve
measurements that are not independent (frames of one drive): they resample whole blocks (episodes,
stretches of frames: :func:`episode_time_blocks`). :func:`crossed_mean_interval` and
:func:`crossed_paired_change` serve sets of training runs driven on the same tracks, where both the
runs and the tracks vary.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np

SUCCESS_RETURN = 900.0    # an episode succeeds at this return: CarRacing's "solved" (its mean over 100 tracks)
CONFIDENCE = 0.95         # of both intervals
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0        # fixed, so a summary is reproducible


def mean_interval(returns: Sequence[float]) -> tuple[float, float]:
    """The 95% interval of the mean of ``returns`` ``[n]``: scipy's BCa bootstrap
    (bias-corrected and accelerated; returns are skewed, a crash costs far more than a
    clean lap gains), ``BOOTSTRAP_RESAMPLES`` resamples from ``BOOTSTRAP_SEED``.

    Fewer than 2 returns: (nan, nan), one episode says nothing of the spread (in
    :func:`return_stats`: None). All returns equal: (value, value), every resample has that
    mean (no spread seen, not certainty)."""
    from scipy.stats import bootstrap

    x = _checked(returns)
    if x.size < 2:
        return math.nan, math.nan
    if np.ptp(x) == 0:   # BCa divides by the (zero) spread of the resampled means
        return float(x[0]), float(x[0])
    ci = bootstrap((x,), np.mean, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                   method="BCa", random_state=BOOTSTRAP_SEED).confidence_interval
    return float(ci.low), float(ci.high)


def block_mean_interval(values: Sequence[float], blocks: Sequence[int]) -> tuple[float, float]:
    """The 95% interval of the mean of ``values`` ``[n]`` by a block bootstrap: whole blocks
    (``blocks`` ``[n]``, one label per value: an episode, or a stretch of neighbouring frames)
    are resampled, never single values, so values that move together (neighbouring frames
    of a drive) count as one piece of evidence, not many. The statistic is the mean over
    the values of the resampled blocks (blocks of unequal size weigh by their size); scipy's
    BCa bootstrap over the blocks' sums and sizes, paired, ``BOOTSTRAP_RESAMPLES`` resamples
    from ``BOOTSTRAP_SEED`` (percentile where BCa is undefined).

    Fewer than 2 blocks: (nan, nan). All values equal: (value, value)."""
    from scipy.stats import bootstrap

    x = _checked(values)
    labels = np.asarray(blocks).reshape(-1)
    if labels.shape != x.shape:
        raise ValueError(f"blocks: expected one label per value ({x.size}), got {labels.size}")
    _, block_of = np.unique(labels, return_inverse=True)
    if block_of.size == 0 or block_of.max() < 1:
        return math.nan, math.nan
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    sums = np.bincount(block_of, weights=x)                                             # [blocks]
    sizes = np.bincount(block_of).astype(np.float64)                                     # [blocks]

    def pooled_mean(block_sums, block_sizes, axis=-1):
        return block_sums.sum(axis=axis) / block_sizes.sum(axis=axis)

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():   # BCa undefined (a few blocks): the percentile interval instead
            warnings.simplefilter("ignore")
            ci = bootstrap((sums, sizes), pooled_mean, paired=True, vectorized=True, confidence_level=CONFIDENCE,
                           n_resamples=BOOTSTRAP_RESAMPLES, method=method,
                           random_state=BOOTSTRAP_SEED).confidence_interval
        if np.isfinite(ci.low) and np.isfinite(ci.high):
            break
    return float(ci.low), float(ci.high)


def episode_time_blocks(episode: Sequence[int], block_steps: int) -> np.ndarray:
    """``[n]`` int64 block label of each step of ``episode`` ``[n]`` (its episode label): each
    stretch of equal labels is cut into pieces of ``block_steps`` consecutive steps (the last
    may be shorter), numbered 0, 1, ... in order: the blocks of :func:`block_bootstrap_interval`."""
    if int(block_steps) < 1:
        raise ValueError(f"block_steps: must be >= 1, got {block_steps!r}")
    labels = np.asarray(episode).reshape(-1)
    if not labels.size:
        return np.zeros(0, np.int64)
    new_stretch = np.r_[True, labels[1:] != labels[:-1]]
    stretch = np.cumsum(new_stretch) - 1                                                # [n]
    position = np.arange(labels.size) - np.flatnonzero(new_stretch)[stretch]            # [n] step in its stretch
    return np.unique(stretch * (labels.size + 1) + position // int(block_steps), return_inverse=True)[1]


def block_bootstrap_interval(statistic: Callable[[np.ndarray], np.ndarray], blocks: Sequence[int],
                             n_resamples: int = 999, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """95% percentile intervals ``[k, 2]`` of a statistic that is not a mean (an AUROC), by a
    block bootstrap: ``statistic(indices)`` maps the item indices of one resample to ``[k]``
    figures; each resample draws as many whole blocks as ``blocks`` ``[n]`` (one label per
    item) has, with replacement, ``n_resamples`` times from ``seed``. A figure that is
    non-finite in more than half the resamples (e.g. a class missing from them), or fewer
    than 2 blocks: (nan, nan)."""
    labels = np.asarray(blocks).reshape(-1)
    _, block_of = np.unique(labels, return_inverse=True)
    k = np.asarray(statistic(np.arange(labels.size)), dtype=np.float64).reshape(-1).size
    count = int(block_of.max()) + 1 if labels.size else 0
    if count < 2:
        return np.full((k, 2), np.nan)
    members = np.split(np.argsort(block_of, kind="stable"), np.cumsum(np.bincount(block_of))[:-1])
    rng = np.random.default_rng(seed)
    figures = np.array([np.asarray(statistic(np.concatenate([members[b] for b in rng.integers(count, size=count)])),
                                   dtype=np.float64).reshape(-1) for _ in range(n_resamples)])   # [R, k]
    tail = 100 * (1 - CONFIDENCE) / 2
    out = np.full((k, 2), np.nan)
    for j in range(k):
        finite = figures[np.isfinite(figures[:, j]), j]
        if 2 * finite.size > n_resamples:
            out[j] = np.percentile(finite, [tail, 100 - tail])
    return out


def success_interval(successes: int, episodes: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate ``successes / episodes`` (scipy's
    ``binomtest(...).proportion_ci``); (nan, nan) without episodes."""
    from scipy.stats import binomtest

    if episodes == 0:
        return math.nan, math.nan
    ci = binomtest(successes, episodes).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


def return_stats(returns: Sequence[float], success_at: float = SUCCESS_RETURN) -> dict[str, Any]:
    """The figures of episode returns ``[n]``: ``episodes`` (n), ``mean_return``, ``std_return``, ``mean_ci95``
    ([lo, hi], :func:`mean_interval`), ``worst_return``, ``success_threshold``, ``successes``
    (episodes with return >= ``success_at``), ``success_rate`` and ``success_ci95`` ([lo, hi],
    :func:`success_interval`). A figure that does not exist is None (JSON null, never NaN):
    ``mean_ci95`` of fewer than 2 returns, and without returns ``worst_return``, ``success_rate``
    and ``success_ci95`` (``mean_return`` and ``std_return`` are then nan).
    A non-finite return is refused (ValueError)."""
    x = _checked(returns)
    n = int(x.size)
    successes = int(np.sum(x >= success_at))
    nan = math.nan
    return {
        "episodes": n,
        "mean_return": float(x.mean()) if n else nan,
        "std_return": float(x.std()) if n else nan,
        "mean_ci95": _rounded(mean_interval(x), 2),
        "worst_return": round(float(x.min()), 2) if n else None,
        "success_threshold": success_at,
        "successes": successes,
        "success_rate": successes / n if n else None,
        "success_ci95": _rounded(success_interval(successes, n), 4),
    }


def paired_change(reference: Sequence[float], treated: Sequence[float]) -> dict[str, Any]:
    """How ``treated`` differs from ``reference``, measured on the same episodes (the same
    tracks, in order): ``mean`` of the per-episode differences ``treated - reference`` and its
    ``ci95`` ([lo, hi], :func:`mean_interval` of the differences: a paired interval, which
    the spread between tracks does not widen; None for fewer than 2 episodes)."""
    a, b = _checked(reference), _checked(treated)
    if a.shape != b.shape:
        raise ValueError(f"paired change: expected one value per episode in both, got {a.size} and {b.size}")
    diff = b - a
    return {"mean": float(diff.mean()) if diff.size else math.nan, "ci95": _rounded(mean_interval(diff), 4)}


def crossed_paired_change(reference, treated) -> dict[str, Any]:
    """How ``treated`` differs from ``reference`` when each is a set of independent runs (one
    policy per training seed) driven on the same tracks: ``reference`` ``[m, T]`` and
    ``treated`` ``[n, T]``, one row per run, one column per track, in the same track order.

    ``mean``: the treated runs' mean minus the reference runs' mean. ``ci95``: its 95%
    t-interval, whose variance adds what varies (the two-way variance of Owen's pigeonhole
    bootstrap, 2007): each side's runs, the variance of its runs' means over its number of
    runs (a seed that drives worse on every track counts as one run, not as T independent
    pairs), and the tracks, the variance over tracks of each track's difference of the two
    sides' means over T (the spread between tracks cancels: both sides drove the same ones);
    its degrees of freedom by Welch-Satterthwaite, so that few seeds give a wide interval.
    Each (run, track) cell's own noise enters both terms: the interval errs wide. A side of
    one run adds no run term: it is taken as the one policy it is (a policy driven beside
    trained ones); with one run a side the interval speaks of these two policies on other
    tracks, not of other seeds. None for fewer than 2 tracks. ``tracks``, ``runs`` ``[m, n]``,
    ``df``."""
    a, b = _runs_by_tracks(reference, treated)
    by_track = b.mean(axis=0) - a.mean(axis=0)                                            # [T]
    out = _crossed_interval(float(b.mean() - a.mean()), by_track, [a, b])
    return {"mean": out["mean"], "ci95": out["ci95"], "tracks": a.shape[1], "runs": [len(a), len(b)], "df": out["df"]}


def crossed_mean_interval(runs) -> dict[str, Any]:
    """The mean over ``runs`` ``[n, T]`` (one row per training seed, one column per track, the
    same tracks for every run) and its 95% t-interval as :func:`crossed_paired_change` makes it
    for one side: the spread between the runs' means over n, plus the spread between the tracks'
    means over T (here it does not cancel). ``mean``, ``ci95`` (None for fewer than 2 tracks),
    ``df``."""
    (x,) = _runs_by_tracks(runs)
    return _crossed_interval(float(x.mean()), x.mean(axis=0), [x])


def _runs_by_tracks(*sides) -> list[np.ndarray]:
    """Each of ``sides`` as float64 ``[runs, T]``, all with the same T; refused otherwise."""
    arrays = [np.asarray(x, dtype=np.float64) for x in sides]
    if any(x.ndim != 2 or not x.size for x in arrays) or len({x.shape[1] for x in arrays}) != 1:
        raise ValueError(f"crossed interval: expected [runs, tracks] on each side with the same tracks, got "
                         f"{' and '.join(str(list(x.shape)) for x in arrays)}")
    if not all(np.isfinite(x).all() for x in arrays):
        raise ValueError("crossed interval: expected finite values")
    return arrays


def _crossed_interval(mean: float, by_track: np.ndarray, sides: list[np.ndarray]) -> dict[str, Any]:
    """``mean`` with its 95% t-interval from the variance over tracks of ``by_track`` ``[T]`` over
    T, plus, for each of ``sides`` with several runs, the variance of its runs' means over their
    number; Welch-Satterthwaite degrees of freedom."""
    from scipy import stats

    tracks = by_track.size
    if tracks < 2:
        return {"mean": mean, "ci95": None, "df": None}
    terms = [(side.mean(axis=1).var(ddof=1) / len(side), len(side) - 1) for side in sides if len(side) > 1]
    terms.append((by_track.var(ddof=1) / tracks, tracks - 1))                            # (variance, df) each
    variance = sum(v for v, _ in terms)
    if variance == 0:   # no spread seen anywhere (not certainty)
        return {"mean": mean, "ci95": [round(mean, 4), round(mean, 4)], "df": None}
    df = variance ** 2 / sum(v ** 2 / d for v, d in terms)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df)) * math.sqrt(variance)
    return {"mean": mean, "ci95": [round(mean - half, 4), round(mean + half, 4)], "df": round(float(df), 2)}


def paired_block_change(reference: Sequence[float], treated: Sequence[float], blocks: Sequence[int]) -> dict[str, Any]:
    """:func:`paired_change` for measurements that are not independent: ``treated -
    reference`` on the same items (frames) ``[n]``, its ``mean`` and ``ci95`` by
    :func:`block_mean_interval` over ``blocks`` ``[n]``, and the number of ``blocks`` and
    ``items``. Non-finite pairs are left out."""
    a, b = np.asarray(reference, dtype=np.float64).reshape(-1), np.asarray(treated, dtype=np.float64).reshape(-1)
    labels = np.asarray(blocks).reshape(-1)
    if not a.shape == b.shape == labels.shape:
        raise ValueError(f"paired change: expected one value and one block per item in both, got {a.size}, "
                         f"{b.size} and {labels.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    diff, labels = b[keep] - a[keep], labels[keep]
    interval = block_mean_interval(diff, labels)
    return {"mean": float(diff.mean()) if diff.size else math.nan, "ci95": _rounded(interval, 4),
            "blocks": int(np.unique(labels).size), "items": int(diff.size)}


def format_return_stats(stats: dict[str, Any]) -> str:
    """:func:`return_stats` in one line, e.g. ``return 883.2 +- 48.2 (95% CI 861.0-903.4),
    worst 716.0, >= 900: 14/20 = 70% (Wilson 48-85%)``."""
    if not stats["episodes"]:
        return "return nan"
    ci = stats["mean_ci95"]
    interval = "" if ci is None else f" (95% CI {ci[0]:.1f}-{ci[1]:.1f})"
    text = f"return {stats['mean_return']:.1f} +- {stats['std_return']:.1f}{interval}, worst {stats['worst_return']:.1f}"
    lo, hi = stats["success_ci95"]
    return (f"{text}, >= {stats['success_threshold']:g}: {stats['successes']}/{stats['episodes']} = "
            f"{100 * stats['success_rate']:.0f}% (Wilson {100 * lo:.0f}-{100 * hi:.0f}%)")


def format_interval(ci, spec: str = ".1f") -> str:
    """An interval ``ci`` ([lo, hi], or None: ``"-"``) as ``"[861.0, 903.4]"``, each end formatted by ``spec``."""
    return "-" if ci is None else f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def format_estimate(value: float, ci, spec: str = ".1f") -> str:
    """``value`` and its interval ``ci`` (:func:`format_interval`, left off when None) as
    ``"883.2 [861.0, 903.4]"``."""
    return f"{value:{spec}}" + ("" if ci is None else " " + format_interval(ci, spec))


def _rounded(interval: tuple[float, float], digits: int) -> list[float] | None:
    """``interval`` as [lo, hi] rounded to ``digits``; None for (nan, nan)."""
    return None if math.isnan(interval[0]) else [round(v, digits) for v in interval]


def _checked(returns: Sequence[float]) -> np.ndarray:
    """``returns`` as float64 ``[n]``; a non-finite one is refused."""
    x = np.asarray(returns, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"episode returns: expected finite numbers, got {x[~np.isfinite(x)].tolist()}")
    return x
