"""Upstream's Hydra config groups, written from this verl's packaged configs.

`ppo_trainer.yaml` (over `upstream_inert.yaml`) is the single source of keys and defaults. Upstream 0.9.1 splits the
same tree into groups (`actor/`, `rollout/`, `critic/`, ...) and checks in the composed result as
`_generated_ppo_trainer.yaml`. This module writes those files from the packaged config, so user YAML that
composes upstream's groups (or swaps one with `override`) loads here. The SFT trainer's `engine/` and `optim/`
groups come from `sft_trainer_engine.yaml` the same way. A test keeps them all current:

    python -m verl.trainer.config.groups          # rewrite the group files
    python -m verl.trainer.config.groups --check  # exit 1 when one is stale
"""
from __future__ import annotations

import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent

# group/option -> the section it holds (None: only composes the base option of its group, as upstream's dp_*)
GROUP_FILES = {
    "actor/actor": "actor_rollout_ref.actor",
    "actor/dp_actor": None,
    "ref/ref": "actor_rollout_ref.ref",
    "ref/dp_ref": None,
    "rollout/rollout": "actor_rollout_ref.rollout",
    "model/hf_model": "actor_rollout_ref.model",
    "critic/critic": "critic",
    "critic/dp_critic": None,
    "data/legacy_data": "data",
    "reward/reward": "reward",
    "algorithm/rollout_correction": "algorithm.rollout_correction",
    "distillation/distillation": "distillation",
    "transfer_queue/transfer_queue": "transfer_queue",
}
# the SFT trainer's groups (upstream's sft_trainer_engine.yaml composes `engine@engine: fsdp` and `optim@optim: fsdp`,
# and its scripts name them: `engine=fsdp optim=fsdp`), written from sft_trainer_engine.yaml's own sections
SFT_GROUP_FILES = {"engine/fsdp": "engine", "optim/fsdp": "optim"}
SFT = "sft_trainer_engine"
GENERATED = "_generated_ppo_trainer"
_HEADER = ("# Written by `python -m verl.trainer.config.groups` from ppo_trainer.yaml and upstream_inert.yaml;\n"
           "# edit those and rerun it. {what}\n")


def composed():
    """The packaged config as Hydra composes it (the inert keys under ppo_trainer.yaml), interpolations kept."""
    from omegaconf import OmegaConf

    layers = [OmegaConf.load(CONFIG_DIR / f"{name}.yaml") for name in ("upstream_inert", "ppo_trainer")]
    for layer in layers:
        layer.pop("defaults", None)
    return OmegaConf.merge(*layers)


def rendered() -> dict[str, str]:
    """File name (relative to the config folder) -> its text."""
    from omegaconf import OmegaConf

    config = composed()
    files = {}
    for name, section in GROUP_FILES.items():
        group, option = name.split("/")
        if section is None:
            base = group
            files[f"{name}.yaml"] = (_HEADER.format(what=f"Upstream's FSDP option: the `{base}` option as is.")
                                     + f"defaults:\n  - {base}\n  - _self_\n")
        else:
            body = OmegaConf.to_yaml(OmegaConf.select(config, section))
            files[f"{name}.yaml"] = _HEADER.format(what=f"The `{section}` section.") + body
    files[f"{GENERATED}.yaml"] = (_HEADER.format(what="The whole composed config, for reference (upstream's layout).")
                                  + OmegaConf.to_yaml(config))
    sft = sft_sections()
    for name, section in SFT_GROUP_FILES.items():
        files[f"{name}.yaml"] = (_SFT_HEADER.format(what=f"The SFT trainer's `{section}` section.")
                                 + OmegaConf.to_yaml(OmegaConf.select(sft, section)))
    return files


_SFT_HEADER = ("# Written by `python -m verl.trainer.config.groups` from sft_trainer_engine.yaml; edit that and rerun it.\n"
               "# {what}\n")


def sft_sections():
    """sft_trainer_engine.yaml's own sections (its defaults list, which composes these groups, left out)."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(CONFIG_DIR / f"{SFT}.yaml")
    config.pop("defaults", None)
    return config


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for rel, text in rendered().items():
        path = CONFIG_DIR / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print("stale config group files (run python -m verl.trainer.config.groups): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
