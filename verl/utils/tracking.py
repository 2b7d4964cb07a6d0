"""Experiment loggers behind one `Tracking.log(data, step)` call.

Backends (`trainer.logger`): `console` (one line per step), `file` (JSON lines, read back by the demo
and the end-to-end tests), `tensorboard` and `wandb` (when those packages are installed).

The file logger follows upstream's layout so existing tooling keeps working: the path is
`$VERL_FILE_LOGGER_PATH`, or else `$VERL_FILE_LOGGER_ROOT` (default ".") / project / experiment.jsonl,
and every line is `{"step": <int>, "data": {<metric>: <value>, ...}}`.
"""
from __future__ import annotations

import json
import math
import os
from numbers import Number

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb")


def _to_python(value):
    """Scalars from numpy / torch become plain Python numbers so json and printing work."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


class ConsoleLogger:
    def log(self, data: dict, step: int) -> None:
        parts = []
        for key, value in data.items():
            value = _to_python(value)
            if isinstance(value, float):
                parts.append(f"{key}:{value:.4g}")
            elif isinstance(value, Number):
                parts.append(f"{key}:{value}")
        print(f"step:{step} - " + " - ".join(parts), flush=True)

    def finish(self) -> None:
        pass


class FileLogger:
    def __init__(self, project_name: str, experiment_name: str):
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if path is None:
            root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
            path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        print(f"File logger writes to {os.path.abspath(path)}", flush=True)
        self._fp = open(path, "w", buffering=1)  # noqa: SIM115 - open for the whole run; line-buffered

    def log(self, data: dict, step: int) -> None:
        clean = {}
        for key, value in data.items():
            value = _to_python(value)
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)  # "nan" / "inf": JSON has no literal for them
            if isinstance(value, (Number, str, bool)) or value is None:
                clean[key] = value
        self._fp.write(json.dumps({"step": step, "data": clean}) + "\n")

    def finish(self) -> None:
        if not self._fp.closed:
            self._fp.close()


class TensorboardLogger:
    def __init__(self, project_name: str, experiment_name: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError(
                "trainer.logger includes 'tensorboard' but the tensorboard package is not installed: "
                "`pip install tensorboard`, or remove 'tensorboard' from trainer.logger."
            ) from err
        log_dir = os.environ.get("TENSORBOARD_DIR", os.path.join("tensorboard_log", project_name, experiment_name))
        os.makedirs(log_dir, exist_ok=True)
        print(f"TensorBoard logs go to {log_dir}", flush=True)
        self.writer = SummaryWriter(log_dir)

    def log(self, data: dict, step: int) -> None:
        for key, value in data.items():
            value = _to_python(value)
            if isinstance(value, Number):
                self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project_name: str, experiment_name: str, config: dict | None):
        try:
            import wandb
        except ImportError as err:
            raise ImportError(
                "trainer.logger includes 'wandb' but the wandb package is not installed: "
                "`pip install wandb`, or use trainer.logger='[console,file]'."
            ) from err
        self.wandb = wandb
        wandb.init(project=project_name, name=experiment_name, config=config,
                   entity=os.environ.get("WANDB_ENTITY"))

    def log(self, data: dict, step: int) -> None:
        self.wandb.log({k: _to_python(v) for k, v in data.items()}, step=step)

    def finish(self) -> None:
        self.wandb.finish()


class Tracking:
    """Fan one metrics dict out to every configured backend."""

    supported_backend = SUPPORTED_BACKENDS

    def __init__(self, project_name: str, experiment_name: str, default_backend="console", config: dict | None = None):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend or [])
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(
                f"trainer.logger has unsupported backend(s) {unknown}; this build supports {list(SUPPORTED_BACKENDS)}."
            )
        self.logger = {}
        for backend in backends:
            if backend == "console":
                self.logger[backend] = ConsoleLogger()
            elif backend == "file":
                self.logger[backend] = FileLogger(project_name, experiment_name)
            elif backend == "tensorboard":
                self.logger[backend] = TensorboardLogger(project_name, experiment_name)
            elif backend == "wandb":
                self.logger[backend] = WandbLogger(project_name, experiment_name, config)
        self._finished = False

    def log(self, data: dict, step: int, backend=None) -> None:
        for name, logger in self.logger.items():
            if backend is None or name in backend:
                logger.log(data=data, step=step)

    def finish(self) -> None:
        """Flush and close every backend once (safe to call again)."""
        if self._finished:
            return
        self._finished = True
        for logger in self.logger.values():
            logger.finish()
