"""Packaging for the hardware-adaptive verl fork.

The distribution is named `verl` on purpose: installing it replaces an installed upstream verl, and
users keep `import verl` and `python -m verl.trainer.main_ppo`.

Dependency floors are the oldest versions whose APIs the code uses (docs/installation.md says how each
is checked). The torch floor matters most: owners of P40/V100 cards are held to older CUDA builds
of torch, so nothing here may raise it for convenience (that is why tensordict is an extra, pinned).
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_version() -> str:
    text = (HERE / "verl" / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise RuntimeError("verl/__init__.py must define __version__")
    return match.group(1)


# torch 2.8: the oldest release on which the whole test suite passes (scripts/test_floor.sh runs it).
# FSDP2 needs CUDA streams before 2.7 (so it cannot shard on CPU), 2.7 lacks
# FSDPModule.set_reshard_after_forward and set_force_sum_reduction_for_comms. Pascal and Volta owners
# get 2.8+ as the cu126 wheels. tests/test_packaging.py scans for APIs newer than the floor.
# transformers 4.56: from_pretrained(dtype=...) (4.51 brought the AttentionInterface registry).
# pyarrow 21: the first whose permissive concat_tables merges struct columns whose fields come in another
# order (a parquet and a jsonl file of the same data). tqdm 4.62: what datasets 2.14 needs. The other
# floors are the oldest releases scripts/test_floor.sh resolved and passed with.
INSTALL_REQUIRES = [
    "torch>=2.8",
    "transformers>=4.56",
    "ray>=2.10",
    "hydra-core>=1.3",
    "omegaconf>=2.3",
    "datasets>=2.14",
    "numpy>=1.24",
    "pandas>=1.5",
    "pyarrow>=21",
    "tqdm>=4.62",
]

EXTRAS_REQUIRE = {
    # Fast rollout engine; used only where the compat plan finds it installed and supported.
    # (0.10.2 is the first vLLM built on torch 2.8, the floor; it pins torch exactly, so install the
    # vLLM that matches your torch.)
    "vllm": ["vllm>=0.10.2"],
    # Memory-efficient attention kernels for GPUs below sm_80 (registered through AttentionInterface).
    # (0.0.32 is the first built on torch 2.8; each xformers release pins one torch release.)
    "xformers": ["xformers>=0.0.32"],
    "tensorboard": ["tensorboard"],
    # verl.tools' schemas are pydantic models, as upstream (transformers >= 5 already depends on it).
    "tools": ["pydantic>=2"],
    # verl.utils.reward_score.math_verify; not in `test`: it pins an antlr4 that hydra's parser cannot load.
    "math_verify": ["math-verify"],
    "wandb": ["wandb"],
    # TensorDict batches for custom code written against upstream (verl.utils.tensordict_utils, DataProto's
    # to/from_tensordict, TensorDict arguments in the nd dispatch). 0.10.0 is upstream 0.9.1's ceiling and runs on
    # torch 2.8; 0.11-0.14 concatenate NonTensorData differently (upstream's own tests fail on them) and 0.15
    # asks for torch >= 2.11, above the floor.
    "tensordict": ["tensordict==0.10.0"],
    # The geo3k reward grades with mathruler (as upstream), which imports pylatexenc without declaring it.
    "reward": ["mathruler>=0.1", "pylatexenc>=2.10"],
    # LoRA (actor_rollout_ref.model.lora_rank > 0). 0.14 is the first peft with LoraConfig(exclude_modules),
    # which upstream's key maps to; peft asks for torch >= 1.13 and accelerate (torch >= 2.6): below the floor.
    "peft": ["peft>=0.14"],
    # QLoRA's 4-bit base (actor_rollout_ref.model.load_in_4bit) and AdamW8bit; the compat plan uses them only
    # where bitsandbytes' own support table covers the device (verl.compat.planning.decider.bitsandbytes_missing).
    "bnb": ["bitsandbytes>=0.45"],
    # Vision-language models (Qwen2/2.5-VL): images decode and the model's image processor runs with Pillow.
    # 9.1: Image.Resampling, which transformers' image processors use.
    "vision": ["pillow>=9.1"],
    # pytest-xdist 3.8: scripts/run_tests.sh runs the suite on workers (-n, --dist loadfile)
    "test": ["pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3.8", "mathruler>=0.1", "pylatexenc>=2.10",
             "peft>=0.14", "pillow>=9.1", "bitsandbytes>=0.45", "tensordict==0.10.0"],
}

setup(
    name="verl",
    version=read_version(),
    description="verl (Volcano Engine RL) with every hardware decision made by a compat planner",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["verl", "verl.*"]),
    package_data={"verl": ["trainer/config/*.yaml", "trainer/config/**/*.yaml"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    classifiers=["Programming Language :: Python :: 3"],
)
