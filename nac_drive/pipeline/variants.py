"""What makes each variant that ``nac-drive compare`` and ``nac-drive tune`` name: the
training arguments it sets (:data:`VARIANTS`), or those ``nac-drive tune`` chose for it
(:func:`read_tuned`, a ``best.json``). Light imports only: the CLI builds parsers from it."""

from __future__ import annotations

from pathlib import Path
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


def read_tuned(path: str | Path, variant: str | None = None) -> dict[str, Any]:
    """The training arguments of a ``best.json`` written by :func:`~nac_drive.pipeline.tune.tune` (checked: a JSON
    object naming its variant and only fields of :class:`TrainArgs`); ``variant``, if given,
    must be the one it was tuned for."""
    import dataclasses

    from nac_drive.io.checkpoint import read_json
    from nac_drive.pipeline.train_args import TrainArgs

    best = read_json(Path(path))
    if not isinstance(best, dict) or not isinstance(best.get("train_args"), dict) or best.get("variant") not in VARIANTS:
        raise ValueError(f"{path}: not a best.json of nac-drive tune (no variant and train_args)")
    if variant is not None and best["variant"] != variant:
        raise ValueError(f"{path}: tuned for {best['variant']}, not {variant}")
    known = {f.name for f in dataclasses.fields(TrainArgs)}
    unknown = set(best["train_args"]) - known
    if unknown:
        raise ValueError(f"{path}: train_args names fields train does not have: {sorted(unknown)}")
    return best["train_args"]
