"""Validation as it was defined before frames were shared: each window run whole through the
policy (its frames encoded again for every window that holds them). The tests check
``train.evaluate`` against it, and ``benchmarks/validation_cost.py`` times both."""

import torch

from nac_drive.pipeline.train import bc_loss


@torch.no_grad()
def window_by_window(policy, dataset, idx, batch_size: int, weights) -> tuple[float, float]:
    """-> (loss, accuracy or mean absolute error) over the windows ``idx``, in batches of
    ``batch_size`` windows in that order, as ``evaluate`` batches them."""
    total, loss_sum, hits_sum = 0, 0.0, 0.0
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, [int(i) for i in idx]),
                                         batch_size=batch_size)
    for frames, stamps, target in loader:
        loss, hits = bc_loss(policy(frames, stamps), target, weights)
        n = target.shape[0] * target.shape[1]
        total, loss_sum, hits_sum = total + n, loss_sum + loss.item() * n, hits_sum + hits
    return loss_sum / total, hits_sum / total
