"""What an interrupted run says (one line: the last complete checkpoint or none, how to resume), and SIGTERM
unwinding like Ctrl-C. The SIGINT end-to-end run is tests/e2e/test_interrupt.py."""
import os
import signal

import pytest
from omegaconf import OmegaConf

from verl.trainer.ppo.task_runner import Interrupted, interruption_line, stop_on_sigterm
from verl.utils.checkpoint.checkpoint_manager import write_tracker


def _config(tmp_path, **trainer):
    return OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ckpt"), "save_freq": 5,
                                         "resume_mode": "auto", **trainer}})


def _complete_step(root, step):
    os.makedirs(root / f"global_step_{step}" / "actor")
    (root / f"global_step_{step}" / "data.pt").touch()
    write_tracker(str(root), step)


def test_the_line_names_the_last_complete_checkpoint_and_how_to_resume(tmp_path):
    _complete_step(tmp_path / "ckpt", 10)
    line = interruption_line(_config(tmp_path))
    assert line == (f"stopped by Ctrl-C; last complete checkpoint: {tmp_path / 'ckpt' / 'global_step_10'}; "
                    "run the same command again to resume from it (trainer.resume_mode=auto).")
    line = interruption_line(_config(tmp_path, resume_mode="disable"), signal.SIGTERM)
    assert line.startswith("stopped by SIGTERM;") and "trainer.resume_from_path=" in line


def test_without_a_checkpoint_the_line_says_none_and_why(tmp_path):
    assert interruption_line(_config(tmp_path, save_freq=-1)) == \
        "stopped by Ctrl-C; no complete checkpoint was saved (set trainer.save_freq=N to save every N steps)."
    assert "starts from scratch" in interruption_line(_config(tmp_path))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("garbled")
    assert "no complete checkpoint" in interruption_line(_config(tmp_path))


def test_sigterm_unwinds_like_ctrl_c():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
        assert isinstance(stop.value, Interrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)
