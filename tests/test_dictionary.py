"""The sparse dictionary of the core's output (nac_drive.interpret.dictionary): a signal made
of a few sparse atoms reaches the variance target on held-out episodes with few atoms per step,
where PCA with as many components does not, and the atom that carries a scene variable is
named after it; noise without structure does not reach the target."""

from __future__ import annotations

import numpy as np
import pytest

from nac_drive.interpret.dictionary import TARGET, held_out_steps, sparse_dictionary
from nac_drive.interpret.probes import r2 as variance_explained   # of a [n, units] reconstruction


def sparse_signal(n=900, units=24, atoms=6, seed=0):
    """(``[n, units]``, ``[n]``): each step the sum of 2 of ``atoms`` random unit directions,
    each weighted +-1 to 3 at random, plus noise; and atom 0's weight at each step (0 where unused)."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(atoms, units))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    codes = np.zeros((n, atoms))
    for i in range(n):
        codes[i, rng.choice(atoms, size=2, replace=False)] = rng.uniform(1, 3, size=2) * rng.choice([-1, 1], size=2)
    return codes @ directions + 0.02 * rng.normal(size=(n, units)), codes[:, 0]


def test_a_signal_of_few_sparse_atoms_reaches_the_target_and_its_atoms_are_named():
    x, speed = sparse_signal()
    episode = np.repeat([0, 1, 2], 300)
    noise = np.random.default_rng(5).normal(size=900)
    result = sparse_dictionary(x, episode, {"speed": speed, "noise": noise}, seed=0)
    assert result["held_out"] == "the last 1 of 3 episodes" and result["held_out_steps"] == 300
    assert result["reached"] and result["sparsity"] <= 2 and result["variance_explained"] >= TARGET
    by_k = {row["k"]: row for row in result["by_sparsity"]}
    assert by_k[2]["variance_explained"] > by_k[2]["pca_variance_explained"] + 0.1   # 6 directions, 2 a step
    assert by_k[16]["pca_variance_explained"] is not None and result["atoms"] == 48
    # atom 0 is in many learnt atoms (an overcomplete dictionary learns prototypes of pairs): the
    # steps that use one, with the sign that carries atom 0 one way, have its weight high or low
    speed_named = [f for f in result["features"] if f["label"] == "speed" and abs(f["auroc"] - 0.5) > 0.4]
    assert len(speed_named) >= 8 and {f["auroc"] > 0.5 for f in speed_named} == {True, False}
    assert all(abs(f["aurocs"]["noise"] - 0.5) < 0.2 for f in result["features"] if f["usage"] >= 0.02)
    assert {f["sign"] for f in result["features"]} == {"+", "-"}
    assert sum(f["usage"] for f in result["features"]) <= result["sparsity"] + 1e-9


def test_an_atom_is_named_after_the_variable_that_tells_its_steps_from_the_others():
    # 2 of 6 directions a step, 48 atoms: one atom a step stands for a pair (a prototype), so its
    # coefficient follows little (|r| < 0.25), but whether it is used says whether direction 0 is
    # in the step
    x, weight = sparse_signal()
    rng = np.random.default_rng(5)
    in_step, noise = (weight != 0) + 0.1 * rng.normal(size=900), rng.normal(size=900)
    result = sparse_dictionary(x, np.repeat([0, 1, 2], 300), {"direction 0 in the step": in_step, "noise": noise})
    assert result["sparsity"] == 1
    named = [f for f in result["features"] if f["label"] == "direction 0 in the step"]
    assert sum(f["auroc"] > 0.75 for f in named) >= 8 and sum(f["auroc"] < 0.4 for f in named) >= 8
    assert all(f["auroc"] == f["aurocs"][f["label"]] and abs(f["correlation"]) < 0.25 for f in named)
    assert all(abs(f["aurocs"]["noise"] - 0.5) < 0.2 for f in result["features"] if f["usage"] >= 0.02)


def test_noise_without_structure_does_not_reach_the_target_and_says_so():
    rng = np.random.default_rng(2)
    result = sparse_dictionary(rng.normal(size=(600, 48)), np.repeat([0, 1], 300), {}, seed=0)
    assert not result["reached"] and result["sparsity"] == 16            # the largest tried
    assert result["by_sparsity"][0]["variance_explained"] < 0.3
    assert all(f["label"] is None for f in result["features"])


def test_the_held_out_steps_and_the_variance_explained_are_as_defined():
    held, which = held_out_steps(np.repeat([4, 2, 9], 10))
    assert which == "the last 1 of 3 episodes" and held.tolist() == [False] * 20 + [True] * 10
    held, which = held_out_steps(np.zeros(600, int))
    assert which == "the last 2 of 6 stretches of 100 steps" and held.sum() == 200
    x = np.arange(12.0).reshape(6, 2)
    assert variance_explained(x, x) == 1.0 and variance_explained(x, np.tile(x.mean(0), (6, 1))) == 0.0
    with pytest.raises(ValueError, match="the dictionary needs 2 stretches of 1 steps or more"):
        held_out_steps(np.zeros(1, int))
    with pytest.raises(ValueError, match="expected finite"):
        sparse_dictionary(np.full((10, 2), np.nan), np.repeat([0, 1], 5), {})
