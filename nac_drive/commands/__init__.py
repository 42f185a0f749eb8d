"""Subcommands of the ``nac-drive`` CLI, one module per verb (see ``nac_drive.cli``)."""
