"""The driving policy and what it is made of: a per-frame encoder (``encoders``) -> a temporal
core over a causal window (``cores``: the NAC layer or a baseline) -> a head, for a task
(``tasks``: what the policy sees and outputs), behind the one contract of everything that
drives (``actor``). The policy itself: :class:`~nac_drive.policy.driving_policy.DrivingPolicy`;
where a ``--policy`` goes (``loading``), its model card (``model_card``), its ONNX export
(``onnx_export``) and an exported file driving (``onnx_policy``).

``from nac_drive.policy import DrivingPolicy`` works (as model cards on the Hub say) and imports
torch only then, so a module that needs only ``tasks`` or ``actor`` stays light.
"""

_LAZY = ("DrivingPolicy", "PolicyConfig")


def __getattr__(name: str):
    if name in _LAZY:
        from nac_drive.policy import driving_policy

        return getattr(driving_policy, name)
    raise AttributeError(f"module 'nac_drive.policy' has no attribute {name!r}")
