"""nac-drive: driving agents built on the Neuronal Attention Circuit (arXiv 2512.10282)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("nac-drive")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["NAC", "NACCache", "NACTrace", "DrivingPolicy", "PolicyConfig", "__version__"]

_LAZY = {"NAC": "nac_drive.nac", "NACCache": "nac_drive.nac", "NACTrace": "nac_drive.nac",
         "DrivingPolicy": "nac_drive.policy.driving_policy", "PolicyConfig": "nac_drive.policy.driving_policy"}


def __getattr__(name: str):
    # Imported on first use, so that `nac-drive --help` does not pay for importing torch.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nac_drive' has no attribute {name!r}")
