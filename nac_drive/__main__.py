"""``python -m nac_drive``: the ``nac-drive`` command (for an environment whose scripts folder is not on PATH)."""

import sys

from nac_drive.cli import main

if __name__ == "__main__":
    sys.exit(main())
