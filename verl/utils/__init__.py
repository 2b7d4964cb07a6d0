"""Utilities shared across verl: data sets, reward rules and tensor helpers (see the submodules)."""
