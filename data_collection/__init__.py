"""Demonstrations on disk.

* :mod:`.episode_recorder`: the wrapper that keeps every episode an env plays;
* :mod:`.carracing_dataset`: CarRacing demonstrations as Minari datasets, and their windows;
* :mod:`.udacity_log`: Udacity ``driving_log.csv`` + ``IMG/`` recordings, read and written;
  :mod:`.udacity_dataset`: their windows; :mod:`.udacity_augment`: their augmentations.
"""
