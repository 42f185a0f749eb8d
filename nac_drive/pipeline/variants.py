"""What makes each variant that ``nac-drive compare`` and ``nac-drive tune`` name: the
training arguments it sets (:data:`VARIANTS`; those ``nac-drive tune`` chose for it:
:func:`~nac_drive.pipeline.train_args.read_tuned`). Light imports only: the CLI builds parsers
from it."""

from __future__ import annotations

from typing import Any

# Each variant: the train arguments it sets (the rest are the comparison's, the same for all).
VARIANTS: dict[str, dict[str, Any]] = {
    "nac-exact": {"core": "nac", "mode": "exact"},
    "nac-euler": {"core": "nac", "mode": "euler"},
    "nac-steady": {"core": "nac", "mode": "steady"},
    "nac-pw": {"core": "nac", "select": "all"},          # every key of the window, no Top-K
    "nac-2k": {"core": "nac", "topk": 2},
    "nac-02s": {"core": "nac", "sparsity": 0.2},
    "nac-09s": {"core": "nac", "sparsity": 0.9},
    "nac-scaled": {"core": "nac", "logit_variant": "scaled"},   # beyond the paper: a learned logit scale per head
    "nac-qk": {"core": "nac", "logit_variant": "qk"},           # beyond the paper: + q.k in the logits
    "lstm": {"core": "lstm"}, "gru": {"core": "gru"}, "cfc": {"core": "cfc"}, "ltc": {"core": "ltc"},
    "mha": {"core": "mha"},
}
