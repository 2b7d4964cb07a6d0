"""Experiment loggers behind one `Tracking.log(data, step)` call.

Backends (`trainer.logger`): `console` (one line per step), `file` (JSON lines, read back by the demo
and the end-to-end tests), `tensorboard` and `wandb` (when those packages are installed).

The file logger follows upstream's layout so existing tooling keeps working: the path is
`$VERL_FILE_LOGGER_PATH`, or else `$VERL_FILE_LOGGER_ROOT` (default ".") / project / experiment.jsonl,
and every line is `{"step": <int>, "data": {<metric>: <value>, ...}}`, one line per step, kept across
resumes (the file is appended to, never started over).
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
    """Appends one JSON line per step. A resumed run keeps the history: `continue_from(step)` drops the
    records of steps after the checkpoint (they are trained again), and a step logged twice (the
    validation before a resumed run, at the checkpoint's step) is merged into its one record."""

    def __init__(self, project_name: str, experiment_name: str):
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if path is None:
            root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
            path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        records = self._read()
        self._steps = {record["step"] for record in records}
        print(f"File logger appends to {os.path.abspath(path)}"
              + (f" ({len(records)} earlier records kept)" if records else ""), flush=True)
        self._fp = None
        self._rewrite(records)  # also drops a line a crash left half-written

    def _read(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        records = []
        with open(self.path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    records.append(record)
        return records

    def _rewrite(self, records: list[dict]) -> None:
        """Replace the file with `records` (atomically) and reopen it for appending."""
        if self._fp is not None:
            self._fp.close()
        tmp = self.path + ".partial"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
        os.replace(tmp, self.path)
        self._fp = open(self.path, "a", buffering=1)  # noqa: SIM115 - open for the whole run; line-buffered

    def continue_from(self, step: int) -> None:
        """Forget the records of steps after `step`: a run resumed at `step` logs them again."""
        if any(s > step for s in self._steps):
            records = [r for r in self._read() if r["step"] <= step]
            self._steps = {r["step"] for r in records}
            self._rewrite(records)

    def log(self, data: dict, step: int) -> None:
        clean = {}
        for key, value in data.items():
            value = _to_python(value)
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)  # "nan" / "inf": JSON has no literal for them
            if isinstance(value, (Number, str, bool)) or value is None:
                clean[key] = value
        if step in self._steps:  # rare (once per resume): merge into the step's one record
            records = self._read()
            for record in records:
                if record["step"] == step:
                    record["data"].update(clean)
            self._rewrite(records)
            return
        self._steps.add(step)
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

    def finish(self, exit_code: int = 0) -> None:
        self.wandb.finish(exit_code=exit_code)


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

    def continue_from(self, step: int) -> None:
        """A run resumed at `step`: backends that keep a history (the file) drop what comes after it."""
        for logger in self.logger.values():
            if hasattr(logger, "continue_from"):
                logger.continue_from(step)

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close every backend once (safe to call again); `exit_code` marks a failed run where the
        backend records one (wandb)."""
        if self._finished:
            return
        self._finished = True
        for logger in self.logger.values():
            if isinstance(logger, WandbLogger):
                logger.finish(exit_code=exit_code)
            else:
                logger.finish()
