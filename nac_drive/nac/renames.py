"""Parameters of the NAC layer renamed since checkpoints were first written, and their upgrade,
so a checkpoint saved before a rename still loads."""

from __future__ import annotations

# old name -> new name (the last component of a state-dict key)
RENAMED_PARAMETERS = {"gate_weight": "phi_tau_weight", "gate_bias": "phi_tau_bias"}


def upgrade_state_names(state: dict) -> dict:
    """A state dict (or name -> shape map) with :data:`RENAMED_PARAMETERS` applied to the
    last component of every name."""
    def new(name: str) -> str:
        last = name.rpartition(".")[2]
        return name[:len(name) - len(last)] + RENAMED_PARAMETERS.get(last, last)
    return {new(name): value for name, value in state.items()}


def rename_in_place(state_dict: dict, prefix: str) -> None:
    """Give the old names under ``prefix`` in ``state_dict`` their current ones (what
    ``NAC._load_from_state_dict`` does first), unless the current name is there too."""
    for old, new in RENAMED_PARAMETERS.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
