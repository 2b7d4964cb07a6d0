"""Hydra configs for the trainer (a package so Hydra can find them when main_ppo is imported, not run)."""
