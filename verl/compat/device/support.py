"""What installed libraries support on a device: facts read from this torch build and from the libraries'
own support tables, for detection to report and the planner to respect."""
from __future__ import annotations

import torch

from verl.compat.device.profile import DeviceProfile, cc_name


def varlen_kernel_available() -> tuple[bool, str]:
    """Whether this torch build has the varlen FlashAttention kernel (detection adds the device's own requirement)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False, f"torch {torch.__version__} has no torch.nn.attention.varlen (added in 2.10)"
    if not torch.backends.cuda.is_flash_attention_available():
        return False, f"torch {torch.__version__} was built without its FlashAttention kernels"
    return True, f"torch {torch.__version__} ships a variable-length FlashAttention kernel"


# bitsandbytes' own support table (its README and installation guide): on NVIDIA GPUs its 4-bit (NF4)
# weights and 8-bit optimizers need compute capability 6.0+ from release 0.48 (5.0+ before: Maxwell
# wheels were dropped then); its CPU backend has 4-bit weights but no 8-bit optimizers; ROCm is listed
# as experimental, so compat does not plan it.
BNB_FEATURES = {"nf4": "4-bit (NF4) base weights", "adamw8bit": "8-bit AdamW states"}


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def bitsandbytes_missing(profile: DeviceProfile, version: str | None, feature: str) -> str | None:
    """Why bitsandbytes cannot give `feature` ("nf4" | "adamw8bit") on `profile` (None when it can)."""
    what = BNB_FEATURES[feature]
    if version is None:
        return f"{what} need bitsandbytes, which is not installed (pip install bitsandbytes)"
    if profile.backend == "rocm":
        return f"bitsandbytes lists its ROCm backend as experimental: compat does not plan its {what} there"
    if profile.backend == "cpu":
        if feature == "adamw8bit":
            return "bitsandbytes has no 8-bit optimizers on CPU (its support table)"
        return None
    floor = (5, 0) if version != "unknown" and _version_tuple(version) < (0, 48) else (6, 0)
    if (profile.compute_capability or (0, 0)) < floor:
        return (f"bitsandbytes {version} supports {what} from compute capability {floor[0]}.{floor[1]} "
                f"(this device has {cc_name(profile)})")
    return None
