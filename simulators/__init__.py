"""Where actions go.

* CarRacing: :mod:`.carracing` (the env factory, its wrappers, the episode runner, the track
  seed ranges), :mod:`.episode_stats` (the runner's figures), :mod:`.perturbations` and
  :mod:`.frame_drops` (``--perturb``), :mod:`.road_drawing` (the road drawn faster);
* Udacity: :mod:`.udacity_bridge`, :mod:`.udacity_server` and :mod:`.udacity_session` (the
  bridge to the simulator), :mod:`.udacity_emulator` (its headless stand-in),
  :mod:`.udacity_env` (the same as a gymnasium env) and :mod:`.udacity_track` (its tracks);
* the road's scene read from a track's geometry: :mod:`.centre_line`,
  :mod:`.carracing_scene`, :mod:`.udacity_scene`.

Importing this package registers the emulator's gymnasium id, ``nac_drive/UdacityEmulator-v0``
(gymnasium's convention for third-party envs); ``import nac_drive`` alone stays light and
does not import gymnasium. ``gym.make("nac_drive.simulators:nac_drive/UdacityEmulator-v0")``
imports it on first use.
"""

from nac_drive.simulators.udacity_env import register as _register

_register()
