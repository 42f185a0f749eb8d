"""Where actions go: CarRacing env factory and wrappers, the Udacity bridge and emulator.

Importing this package registers the emulator's gymnasium id, ``nac_drive/UdacityEmulator-v0``
(gymnasium's convention for third-party envs); ``import nac_drive`` alone stays light and
does not import gymnasium. ``gym.make("nac_drive.simulators:nac_drive/UdacityEmulator-v0")``
imports it on first use.
"""

from nac_drive.simulators.udacity_env import register as _register

_register()
