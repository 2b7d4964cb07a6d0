"""Upstream's previous PPO entry point; here the same as `python -m verl.trainer.main_ppo`."""
from verl.trainer.main_ppo import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
