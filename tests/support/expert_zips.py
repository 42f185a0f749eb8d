"""Copies of the shipped expert zip with members or JSON fields changed."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from nac_drive.agents.ppo_lab.expert_zip import read_data
from nac_drive.agents.ppo_expert import shipped_expert_path


def rewrite_zip(src: Path, dst: Path, **members: bytes) -> Path:
    """Copy the zip ``src`` to ``dst`` with the named members (dots as ``__``) replaced."""
    members = {name.replace("__", "."): data for name, data in members.items()}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, members.pop(item.filename, None) or zin.read(item.filename))
        for name, data in members.items():
            zout.writestr(name, data)
    return dst


def shipped_with_data(dst: Path, **changes) -> Path:
    """A copy of the shipped zip at ``dst`` with its JSON ``data`` fields changed (None: removed)."""
    data = {**read_data(shipped_expert_path()), **changes}
    data = {key: value for key, value in data.items() if value is not None}
    return rewrite_zip(shipped_expert_path(), dst, data=json.dumps(data).encode())
