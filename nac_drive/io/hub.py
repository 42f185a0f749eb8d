"""Checkpoints on the Hugging Face Hub: a Hub id to a local folder.

A Hub id (``owner/name``) is fetched by ``huggingface_hub.hf_hub_download`` into its cache
(``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` reads the cache only) and the snapshot folder it
lands in is then loaded like any checkpoint folder, with every check of the folder loader:
nothing the Hub sends is parsed or built on another path.

Without a network, ``hf_hub_download`` retries for ~25 s before it gives up. So the Hub is
asked once first, without retries and with a short timeout (:data:`HUB_PROBE_TIMEOUT_S`):
when it cannot be reached, a cached copy is loaded if there is one, and otherwise the load
fails at once in one line that names the two ways out (a local folder, ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

from nac_drive.io.atomic import readable_dir
from nac_drive.io.checkpoint import CONFIG, WEIGHTS, CheckpointError

# owner/name: letters, digits, "-", "_", "." (the Hub's rule, simplified). A bare name is
# taken for a folder, so a mistyped folder name does not go looking on the Hub.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
HUB_PROBE_TIMEOUT_S = 2.0   # the first request's timeout: a Hub that cannot answer in it counts as unreachable


def is_hub_id(source: str | Path) -> bool:
    """Whether ``source`` names a Hub repository rather than a folder: no folder of that name
    exists (whole or parked aside mid-write, see :func:`readable_dir`), it has the shape
    ``owner/name``, and no folder here is named like its owner (``runs/typo`` is a mistyped
    folder, not a repository to look for on the Hub)."""
    return (not readable_dir(source).exists() and _HUB_ID.fullmatch(str(source)) is not None
            and not Path(source).parent.is_dir())


def download_checkpoint(repo_id: str, *, revision: str | None = None, cache_dir: str | Path | None = None,
                        force_download: bool = False, local_files_only: bool = False,
                        token: str | bool | None = None) -> Path:
    """The cached snapshot folder holding ``repo_id``'s config and weights, downloaded if
    needed. Both files come from one commit: the weights are fetched at the commit the
    config resolved to, so a push between the two downloads cannot mix checkpoints."""
    def fetch(filename: str, at: str | None, cache_only: bool) -> Path:
        try:
            return Path(hf_hub_download(repo_id=repo_id, filename=filename, revision=at, cache_dir=cache_dir,
                                        force_download=force_download, local_files_only=cache_only,
                                        token=token))
        except (EntryNotFoundError, OSError, ValueError) as e:   # every Hub, cache and offline error
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"{repo_id}: no checkpoint folder of that name here, and the Hub's {filename} "
                                  f"could not be fetched ({type(e).__name__}: {first_line})") from None

    unreachable = None if local_files_only else _unreachable(repo_id, revision, token)
    if unreachable and not force_download:
        try:   # what hf_hub_download itself falls back to, without its retries
            return download_checkpoint(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
        except CheckpointError:
            pass
    if unreachable:
        raise CheckpointError(f"{repo_id}: no checkpoint folder of that name here, and the Hugging Face Hub "
                              f"cannot be reached ({unreachable}); give a local checkpoint folder, or set "
                              f"HF_HUB_OFFLINE=1 to load only what the Hub cache holds")
    cache_only = local_files_only or constants.HF_HUB_OFFLINE
    config = fetch(CONFIG, revision, cache_only)
    snapshot = config.parent   # <cache>/models--owner--name/snapshots/<commit>/
    fetch(WEIGHTS, snapshot.name, cache_only)
    return snapshot


def _unreachable(repo_id: str, revision: str | None, token: str | bool | None) -> str | None:
    """Why the Hub cannot be reached (one request for the config's metadata, no retries, a
    :data:`HUB_PROBE_TIMEOUT_S` timeout), or None when it answers: an HTTP error (a missing
    repository, a refused token) is an answer, left to ``hf_hub_download`` to report. None
    offline (``HF_HUB_OFFLINE=1``: no request at all)."""
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, CONFIG, revision=revision), token=token,
                             timeout=HUB_PROBE_TIMEOUT_S, retry_on_errors=False)
    except HfHubHTTPError:
        return None
    except Exception as e:   # the transport's own errors: no name resolution, refused, timed out
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return None
