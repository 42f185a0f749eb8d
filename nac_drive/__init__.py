"""nac-drive: driving agents built on the Neuronal Attention Circuit (arXiv 2512.10282)."""

from importlib.metadata import PackageNotFoundError, version

from nac_drive.nac import NAC, NACCache, NACTrace

try:
    __version__ = version("nac-drive")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["NAC", "NACCache", "NACTrace", "__version__"]
