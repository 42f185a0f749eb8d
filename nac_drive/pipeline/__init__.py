"""The pipeline: the verbs of ``nac-drive`` that compose several parts of the package, as
functions, above every layer they use.

- :mod:`~nac_drive.pipeline.collect`: experts drive CarRacing, demonstrations become a Minari dataset;
- :mod:`~nac_drive.pipeline.train`: behaviour cloning (its arguments: :mod:`~nac_drive.pipeline.train_args`);
- :mod:`~nac_drive.pipeline.dagger`: DAgger rounds, an oracle labelling the student's states;
- :mod:`~nac_drive.pipeline.drive`: a trained policy closed-loop (CarRacing, the Udacity emulator in-process, or Udacity through the bridge);
- :mod:`~nac_drive.pipeline.explain`: a policy's traced drive measured (``nac_drive.interpret``'s analyses, and drives in closed loop under interventions);
- :mod:`~nac_drive.pipeline.evaluate`: experts scored on tracks;
- :mod:`~nac_drive.pipeline.compare`: cores and NAC variants trained and driven alike, several seeds
  (the variants: :mod:`~nac_drive.pipeline.variants`); :mod:`~nac_drive.pipeline.tune`: a variant's
  hyper-parameters by Optuna;
- :mod:`~nac_drive.pipeline.quickstart`: the shipped policy driven -> dashboard in one call; with
  ``--full``, collect -> train -> DAgger -> drive -> dashboard;
- what they share: :mod:`~nac_drive.pipeline.processes` (worker processes),
  :mod:`~nac_drive.pipeline.ray_tasks` (the same jobs as Ray tasks), :mod:`~nac_drive.pipeline.shards`
  (runs of tracks driven and recorded, one shard each), :mod:`~nac_drive.pipeline.run_log`
  (a training run's TensorBoard log).

``nac_drive.cli`` parses arguments into their argument dataclasses and calls these; nothing below imports them
(``tests/test_layers.py``).
"""
