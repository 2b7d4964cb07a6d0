"""The stock entry point: `python -m verl.trainer.main_ppo key=value ...`, as upstream.

The command-line overrides are checked against the key tree before Hydra composes them, and the
composed config is validated before torch, Ray or transformers are imported, so a wrong key or an
inconsistent batch setting costs a second, not a cluster start-up. Config errors exit with status 2
and a message that says what to change.
"""
from __future__ import annotations

import sys

from verl.trainer.config_check import ConfigError, check_overrides, normalize, validate

CONFIG_ERROR_EXIT = 2


def _fail(error: ConfigError) -> None:
    print(f"verl: config error:\n{error}", file=sys.stderr)
    raise SystemExit(CONFIG_ERROR_EXIT)


def _warn(messages: list[str]) -> None:
    for message in messages:
        print(f"verl: warning: {message}", file=sys.stderr)


def run_ppo(config, task_runner_class=None) -> None:
    """Run PPO/GRPO training for a composed, validated config (upstream's name and signature).

    `task_runner_class` is accepted for upstream compatibility; this fork has one task runner.
    """
    if task_runner_class is not None:
        raise NotImplementedError("custom task runner classes are not supported by this fork")
    from verl.trainer.ppo.task_runner import run_ppo as _run_ppo

    _run_ppo(config)


def _task(config) -> None:
    """What Hydra runs once it has composed the config."""
    try:
        normalize(config)
        _warn(validate(config))
    except ConfigError as error:
        _fail(error)
    from verl.utils.startup.clock import startup_clock

    startup_clock().mark("config")
    import signal

    from verl.trainer.ppo.task_runner import Interrupted, interruption_line, stop_on_sigterm
    from verl.trainer.preflight import InputError

    stop_on_sigterm()
    try:
        run_ppo(config)
    except InputError as error:
        print(f"verl: input error (found before training started):\n{error}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT) from None
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM as Interrupted; Ray is already shut down
        signum = Interrupted.signum if isinstance(stop, Interrupted) else signal.SIGINT
        print(f"\nverl: {interruption_line(config, signum)}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None


def unique_run_dir(args: list[str]) -> list[str]:
    """Hydra's default output folder (outputs/<date>/<time>) plus this process's id, unless the user
    chose one: runs started in the same second get their own folders instead of sharing one."""
    import os

    if any(a.lstrip("+").startswith("hydra.run.dir=") for a in args):
        return args
    return [*args, f"hydra.run.dir=outputs/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}-{os.getpid()}"]


def __getattr__(name: str):
    """`create_rl_dataset` / `create_rl_sampler`, importable from here as in earlier upstream releases;
    loaded on first use so importing main_ppo stays cheap (the config check runs before torch loads)."""
    if name in ("create_rl_dataset", "create_rl_sampler"):
        from verl.utils.dataset import rl_dataset

        return getattr(rl_dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Check the overrides in sys.argv, then let Hydra compose `config/ppo_trainer.yaml` and run."""
    from verl.utils.startup.bytecode_cache import configure
    from verl.utils.startup.clock import startup_clock

    startup_clock().mark("python")   # interpreter start-up and this module's imports
    configure()   # before anything imports torch: where the image keeps no bytecode, cache it
    try:
        args, warnings = check_overrides(sys.argv[1:])
    except ConfigError as error:
        _fail(error)
    _warn(warnings)
    sys.argv[1:] = unique_run_dir(args)

    import hydra

    hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)(_task)()


if __name__ == "__main__":
    main()
