"""The model card of a driving policy (the ``README.md`` of its checkpoint folder and Hub
repository), generated from its config: what it drives, its core, its held-out score as a
model-index entry the Hub displays, and how to load it. :meth:`DrivingPolicy.generate_model_card`
calls :func:`model_card`; :data:`CARD_TEMPLATE` is the class's ``model_card_template``.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from nac_drive.policy.tasks import DISCRETE_GAS

# The evaluation environment each task is scored in (the model-index "dataset" of a score).
EVAL_ENVS = {"carracing": "CarRacing-v3", "udacity": "udacity-simulator"}
CARD_KEYS = ("data", "held_out_score", "held_out_metric")

CARD_TEMPLATE = """---
{{ card_data }}
---

# nac-drive {{ task }} policy ({{ core }} core)

A driving policy from nac-drive (the Neuronal Attention Circuit, [paper]({{ paper_url }})):
a per-frame `{{ encoder }}` encoder, a `{{ core }}` temporal core over a causal window of
{{ window }} frames and a head with {{ num_outputs }} {{ action }} output(s), trained by
behaviour cloning.

| | |
|---|---|
| task | `{{ task }}` (evaluated in `{{ eval_env }}`{{ env_note }}) |
| core | {{ core_details }} |
| data | {{ data | default("not recorded", true) }} |
| held-out score | {{ score_text }} |

Load it (nothing is unpickled; sizes are checked before anything is allocated):

```python
from nac_drive.policy import DrivingPolicy
policy = DrivingPolicy.from_pretrained("{{ repo_id | default("owner/name", true) }}")
```
"""


def model_card(config, base: ModelCardData, template: str, paper_url: str | None, **kwargs: Any) -> ModelCard:
    """The card of a policy with ``config`` (its :class:`~nac_drive.policy.driving_policy.PolicyConfig`,
    read, not imported: the policy imports this module): metadata ``base`` (library, tags) plus
    the task tag and, when ``held_out_score`` is given, a model-index entry the Hub displays.

    kwargs: ``data`` (what it was trained on: a dataset path or id), ``held_out_score`` (a
    number), ``held_out_metric`` (what the score measures), ``repo_id``.
    """
    unknown = sorted(set(kwargs) - {*CARD_KEYS, "repo_id"})
    if unknown:
        raise ValueError(f"model_card_kwargs: unknown keys {unknown}; known: {', '.join(CARD_KEYS)}")
    score, metric = kwargs.get("held_out_score"), kwargs.get("held_out_metric") or "mean episode return"
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
        raise ValueError(f"model_card_kwargs.held_out_score: expected a number, got {score!r}")
    core = config.core
    metadata = ModelCardData(**base.to_dict())   # a copy: the class's metadata is shared by every policy
    metadata.tags = sorted({*(metadata.tags or []), config.task, core.core})
    eval_env = EVAL_ENVS[config.task]
    if score is not None:
        from huggingface_hub import EvalResult
        metadata.model_name = kwargs.get("repo_id") or f"nac-drive-{config.task}-{core.core}"
        metadata.eval_results = [EvalResult(task_type="reinforcement-learning", dataset_type=eval_env,
                                        dataset_name=eval_env, metric_type=metric, metric_value=float(score),
                                        dataset_config=_env_config(config))]
    details = (f"`{core.core}`, window {core.window}, d_model {core.d_model}, {core.num_heads} heads, "
               f"top-k {core.topk}, mode `{core.mode}`")
    return ModelCard.from_template(
        metadata, template_str=template, paper_url=paper_url, task=config.task, eval_env=eval_env,
        env_note=_env_note(config), core=core.core, core_details=details, window=core.window, encoder=config.encoder,
        action=config.action, num_outputs=config.num_outputs, data=kwargs.get("data"), repo_id=kwargs.get("repo_id"),
        score_text="not measured" if score is None else f"{score:g} ({metric}, {eval_env})")


def _env_config(config) -> str | None:
    """The model-index ``dataset_config`` of the env the policy was scored in: None for the
    task's stock env, ``gas-<gas>`` for CarRacing's discrete actions with another gas."""
    return None if config.gas == DISCRETE_GAS else f"gas-{config.gas!r}"


def _env_note(config) -> str:
    """How the policy's env differs from the task's stock env (the card's task row)."""
    if config.gas == DISCRETE_GAS:
        return ""
    return (f", its GAS action pressing {config.gas!r}: "
            f"`nac_drive.simulators.carracing.make_carracing(gas={config.gas!r})`")
