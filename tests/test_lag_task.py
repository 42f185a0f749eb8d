"""The known-answer sequence task (tests/support/lag_task.py): its labels are the bit exactly
LAG steps back and nothing else predicts them; a core that reads the past learns it, one that
cannot see the past stays at chance."""

import pytest
import torch

from nac_drive.policy.cores import CoreConfig
from support.lag_task import FEATURES, LAG, lag_batch, train_lag_task

torch.set_num_threads(1)


def test_the_label_is_the_bit_exactly_lag_steps_back():
    x, t, labels, has_label = lag_batch(4, 16, torch.Generator().manual_seed(0))
    assert x.shape == (4, 16, FEATURES) and torch.equal(t[0], torch.arange(16.0))
    assert not has_label[:, :LAG].any() and has_label[:, LAG:].all()
    bits = x[..., 0]
    for i in range(LAG, 16):
        assert torch.equal(labels[:, i], (bits[:, i - LAG] > 0).float())


def test_no_other_step_predicts_the_label():
    x, _, labels, has_label = lag_batch(4000, 16, torch.Generator().manual_seed(1))
    bits, target = x[..., 0], labels[:, 15] * 2 - 1
    agreement = {lag: float((bits[:, 15 - lag] * target).mean()) for lag in range(16)}
    assert agreement[LAG] == 1.0
    assert max(abs(a) for lag, a in agreement.items() if lag != LAG) < 0.06   # chance: +-1/sqrt(4000) ~ 0.016


@pytest.mark.slow
def test_cores_that_read_the_past_learn_it_and_one_that_cannot_stays_at_chance():
    assert train_lag_task(CoreConfig(core="mha"), steps=300) > 0.97
    assert train_lag_task(CoreConfig(core="nac"), steps=300) > 0.75            # the paper's NAC reads step i-5
    assert 0.4 < train_lag_task(CoreConfig(core="nac", window=1), steps=150) < 0.6   # sees only step i
