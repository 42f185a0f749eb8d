"""Where actions go: CarRacing env factory and wrappers, the Udacity bridge and emulator."""
