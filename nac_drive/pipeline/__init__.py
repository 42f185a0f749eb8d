"""The pipeline: the verbs of ``nac-drive`` that compose several parts of the package, as
functions, above every layer they use.

- :mod:`~nac_drive.pipeline.collect`: experts drive CarRacing, demonstrations become a Minari dataset;
- :mod:`~nac_drive.pipeline.train`: behaviour cloning (its arguments: :mod:`~nac_drive.pipeline.train_args`);
- :mod:`~nac_drive.pipeline.dagger`: DAgger rounds, an oracle labelling the student's states;
- :mod:`~nac_drive.pipeline.drive`: a trained policy closed-loop (CarRacing, the Udacity emulator in-process, or Udacity through the bridge);
- :mod:`~nac_drive.pipeline.explain`: a policy's traced drive measured (the paper's Fig. 4 claim, the neuron atlas, saliency, the window, silencing in closed loop);
- :mod:`~nac_drive.pipeline.evaluate`: experts scored on tracks;
- :mod:`~nac_drive.pipeline.quickstart`: collect -> train -> DAgger -> drive -> dashboard in one call.

``nac_drive.cli`` parses arguments into their argument dataclasses and calls these; nothing below imports them
(``tests/test_layers.py``).
"""
