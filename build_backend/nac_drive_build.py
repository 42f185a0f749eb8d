"""setuptools' build backend, less one trap: it never ships a module the checkout no longer has.

setuptools builds a wheel from a checkout through ``build/lib`` and never empties it, so a module
deleted or renamed since the last build would still be in the next wheel (and in the install made
from it). Every wheel here starts from an empty ``build/``; the rest is setuptools' own backend.
"""

import shutil

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403  (the other hooks, unchanged)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    shutil.rmtree("build", ignore_errors=True)   # the hooks run in the project's root
    return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)
