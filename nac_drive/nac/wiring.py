"""NCP wiring as plain data: the 0/1 masks the NAC layer multiplies its weights by.

All wirings come from :class:`ncps.wirings.AutoNCP`; this module only cuts the
adjacency matrices it builds into the blocks a feed-forward layer needs.

* :func:`sensory_gate_mask` - the sensory -> inter synapses of an AutoNCP whose
  inter layer has exactly ``output_dim`` neurons: the mask of one q/k/v gate
  (paper eq. 13), ``[input_dim, output_dim]``.
* :class:`BackboneWiring` - sensory -> inter -> command -> motor masks of an
  AutoNCP, for the per-pair backbone of eqs. 14-16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ncps.wirings import AutoNCP

INTER, COMMAND, MOTOR = 0, 1, 2  # ncps layer ids of an NCP wiring


def _built_autoncp(units: int, motor: int, sparsity: float, seed: int, input_dim: int) -> AutoNCP:
    wiring = AutoNCP(units, motor, sparsity_level=sparsity, seed=seed)
    wiring.build(input_dim)
    return wiring


def _units_for_inter(inter: int, motor: int) -> int:
    """Smallest AutoNCP size whose inter layer has exactly ``inter`` neurons."""
    units = inter + motor + 1
    while True:
        rest = units - motor
        if rest - max(int(0.4 * rest), 1) == inter:
            return units
        units += 1


def sensory_gate_mask(input_dim: int, output_dim: int, sparsity: float, seed: int) -> np.ndarray:
    """0/1 mask ``[input_dim, output_dim]`` of one sensory gate.

    The gate's outputs are the inter neurons of an AutoNCP fed by ``input_dim``
    sensory neurons; AutoNCP guarantees every inter neuron has at least one input.
    """
    wiring = _built_autoncp(_units_for_inter(output_dim, 1), 1, sparsity, seed, input_dim)
    inter = wiring.get_neurons_of_layer(INTER)
    return (np.abs(wiring.sensory_adjacency_matrix[:, inter]) > 0).astype(np.float32)


@dataclass(frozen=True)
class BackboneWiring:
    """Masks of the inter -> command -> motor backbone (paper eqs. 14-16).

    ``sensory_to_inter`` is ``[input_dim, n_inter]``, ``inter_to_command``
    ``[n_inter, n_command]``, ``command_to_motor`` ``[n_command, n_motor]``.
    The command layer's recurrent synapses are not used: the backbone is evaluated
    once per query-key pair, not unrolled in time.
    """

    sensory_to_inter: np.ndarray
    inter_to_command: np.ndarray
    command_to_motor: np.ndarray

    @classmethod
    def auto(cls, input_dim: int, units: int, motor: int, sparsity: float, seed: int) -> "BackboneWiring":
        wiring = _built_autoncp(units, motor, sparsity, seed, input_dim)
        inter, command, motor_ids = (wiring.get_neurons_of_layer(i) for i in (INTER, COMMAND, MOTOR))
        adjacency = np.abs(wiring.adjacency_matrix) > 0
        return cls(
            sensory_to_inter=(np.abs(wiring.sensory_adjacency_matrix[:, inter]) > 0).astype(np.float32),
            inter_to_command=adjacency[np.ix_(inter, command)].astype(np.float32),
            command_to_motor=adjacency[np.ix_(command, motor_ids)].astype(np.float32),
        )

    @property
    def sizes(self) -> tuple[int, int, int]:
        """(n_inter, n_command, n_motor)."""
        return (self.sensory_to_inter.shape[1], self.inter_to_command.shape[1], self.command_to_motor.shape[1])
