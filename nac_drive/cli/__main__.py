"""``python -m nac_drive.cli``: the ``nac-drive`` command."""

import sys

from nac_drive.cli import main

if __name__ == "__main__":
    sys.exit(main())
