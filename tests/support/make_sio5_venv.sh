#!/usr/bin/env bash
# Create the small side venv holding python-socketio 5.x, used only by
# tests/test_udacity_sio5.py to show that the Udacity simulator's wire protocol
# does NOT work against python-socketio >= 5 (python-socketio 5 cannot be
# installed next to the 4.6 pin of the `udacity` extra).
#
# Usage: NAC_DRIVE_SIO5_PYTHON=/path/to/venv/bin/python bash tests/support/make_sio5_venv.sh
# The venv is created at the grand-parent of $NAC_DRIVE_SIO5_PYTHON (…/venv for …/venv/bin/python).
set -euo pipefail
: "${NAC_DRIVE_SIO5_PYTHON:?set NAC_DRIVE_SIO5_PYTHON to the python of the venv to create, e.g. \$HOME/.cache/nac-drive/sio5-venv/bin/python}"
venv_dir="$(dirname "$(dirname "$NAC_DRIVE_SIO5_PYTHON")")"
base_python="${PYTHON:-python3}"
if [ ! -x "$NAC_DRIVE_SIO5_PYTHON" ]; then
    "$base_python" -m venv "$venv_dir"
fi
if [ ! -f "$venv_dir/.sio5-complete" ]; then
    "$NAC_DRIVE_SIO5_PYTHON" -m pip install --quiet --disable-pip-version-check \
        "python-socketio>=5,<6" "python-engineio>=4,<5" "eventlet>=0.33"
    touch "$venv_dir/.sio5-complete"
fi
"$NAC_DRIVE_SIO5_PYTHON" -c "from importlib.metadata import version as v; print('sio5 venv ready: python-socketio', v('python-socketio'), 'in $venv_dir')"
