"""Demonstrations on disk: CarRacing episode datasets, Udacity driving logs."""
