"""The Neuronal Attention Circuit layer (arXiv 2512.10282, §2), one module per idea.

* :mod:`.layer`: the ``NAC`` module, its equations in the paper's order (eq. 13 -> Top-K ->
  eq. 14 -> eqs. 15/16 -> t_ij -> eqs. 2/3/18 -> softmax -> eq. 19), and ``NACTrace``;
* :mod:`.wiring`: the NCP wiring (AutoNCP masks); :mod:`.sparse_linear`: weights multiplied
  by those masks;
* :mod:`.selection`: Top-K key selection (exact, block = Alg. 2, all) and what a query may see;
* :mod:`.packing`: the weights packed for few products, cached, and the packed key rows;
* :mod:`.streaming`: ``NACCache`` and one frame at a time (``NAC.step``);
* :mod:`.kernels` (+ :mod:`._numba`): the fused CPU kernels and when they serve;
* :mod:`.clamp`: interventions; :mod:`.renames`: old checkpoint names; :mod:`.validation`:
  what the layer refuses.

The room imports nothing else of ``nac_drive``; the kernels read :mod:`.packing`, never the
layer. Differences from the paper and from the public reference code: ``docs/nac-vs-paper.md``.
"""

from nac_drive.nac.clamp import Clamp
from nac_drive.nac.layer import NAC, NACTrace
from nac_drive.nac.renames import RENAMED_PARAMETERS, upgrade_state_names
from nac_drive.nac.streaming import NACCache
from nac_drive.nac.validation import MODES, SELECTIONS, TIME_INPUTS

__all__ = ["NAC", "NACCache", "NACTrace", "Clamp", "RENAMED_PARAMETERS", "upgrade_state_names", "MODES",
           "SELECTIONS", "TIME_INPUTS"]
