"""The verbs of ``nac-drive``, one module each (see :mod:`nac_drive.cli.main`)."""
