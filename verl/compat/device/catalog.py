"""Known devices, so a run can be planned (and simulated) as if on a GPU we do not have.

Figures are from the vendors' spec sheets and whitepapers (dense rates, no sparsity; boost
clocks). `fp16_tflops` is the tensor-core rate with fp32 accumulation where the device has
tensor cores (GeForce parts run that at half their fp16-accumulate rate); on Pascal it is the
plain CUDA-core rate (P40: 1/64 of fp32, i.e. unusable). `memory_gb` is what the driver
reports as total memory, in GiB, which is a little under the marketing figure.
`shared_mem_per_block_kb` is the opt-in per-block maximum from the CUDA programming guide's
compute-capability table (48 KB on sm_6x, 96 on sm_70, 64 on sm_75, 163 on sm_80, 99 on
sm_86/89, 227 on sm_90). MI300X (gfx942) reports (9, 4) through torch's ROCm build; the
planner branches on `backend == "rocm"`, never on that number.
"""
from __future__ import annotations

import difflib

from verl.compat.device.profile import DeviceProfile


def _gpu(name, compute_capability, memory_gb, sm_count, smem, bandwidth_gbs, fp32, fp16, bf16, backend="cuda") -> DeviceProfile:
    major = compute_capability[0]
    rocm = backend == "rocm"
    return DeviceProfile(
        name=name, backend=backend, compute_capability=compute_capability, memory_gb=memory_gb, sm_count=sm_count,
        shared_mem_per_block_kb=smem, bandwidth_gbps=bandwidth_gbs, fp32_tflops=fp32, fp16_tflops=fp16,
        bf16_tflops=bf16, native_bf16=rocm or major >= 8, tensor_core_fp16=rocm or major >= 7,
        tf32=rocm or major >= 8,
    )


CATALOG: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile(name="cpu", backend="cpu", compute_capability=None, memory_gb=32.0,
                         host_memory_gb=32.0),
    #                 name         cc      GiB    SMs  smem  GB/s   fp32   fp16    bf16
    "p40": _gpu("p40", (6, 1), 23.9, 30, 48, 346, 11.8, 0.18, 0.0),
    "p100": _gpu("p100", (6, 0), 15.9, 56, 48, 732, 9.3, 18.7, 0.0),
    "v100-16gb": _gpu("v100-16gb", (7, 0), 15.8, 80, 96, 900, 15.7, 125.0, 0.0),
    "v100-32gb": _gpu("v100-32gb", (7, 0), 31.7, 80, 96, 900, 15.7, 125.0, 0.0),
    "t4": _gpu("t4", (7, 5), 14.7, 40, 64, 320, 8.1, 65.0, 0.0),
    "rtx2080ti": _gpu("rtx2080ti", (7, 5), 10.7, 68, 64, 616, 13.4, 53.8, 0.0),
    "rtx3090": _gpu("rtx3090", (8, 6), 23.7, 82, 99, 936, 35.6, 71.0, 71.0),
    "rtx4090": _gpu("rtx4090", (8, 9), 23.6, 128, 99, 1008, 82.6, 165.2, 165.2),
    "a10": _gpu("a10", (8, 6), 22.1, 72, 99, 600, 31.2, 125.0, 125.0),
    "l4": _gpu("l4", (8, 9), 22.0, 58, 99, 300, 30.3, 121.0, 121.0),
    "a100-40gb": _gpu("a100-40gb", (8, 0), 39.4, 108, 163, 1555, 19.5, 312.0, 312.0),
    "a100-80gb": _gpu("a100-80gb", (8, 0), 79.2, 108, 163, 2039, 19.5, 312.0, 312.0),
    "l40s": _gpu("l40s", (8, 9), 44.4, 142, 99, 864, 91.6, 362.0, 362.0),
    "h100": _gpu("h100", (9, 0), 79.1, 132, 227, 3350, 67.0, 989.4, 989.4),
    "h200": _gpu("h200", (9, 0), 139.8, 132, 227, 4800, 67.0, 989.4, 989.4),
    # CDNA3: 304 compute units, 64 KB LDS per workgroup; fp32 is the matrix-core rate.
    "mi300x": _gpu("mi300x", (9, 4), 191.5, 304, 64, 5300, 163.4, 1307.4, 1307.4, backend="rocm"),
}

ALIASES: dict[str, str] = {
    "tesla-p40": "p40", "tesla-p100": "p100", "v100": "v100-32gb", "tesla-v100": "v100-32gb",
    "tesla-t4": "t4", "2080ti": "rtx2080ti", "3090": "rtx3090", "4090": "rtx4090",
    "a100": "a100-80gb", "h100-80gb": "h100", "h200-141gb": "h200", "mi300": "mi300x",
}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def get_profile(name: str) -> DeviceProfile:
    """The catalog profile for `name` (case-insensitive; aliases such as "a100" accepted)."""
    key = _normalise(name)
    key = ALIASES.get(key, key)
    if key in CATALOG:
        return CATALOG[key]
    valid = sorted(CATALOG) + sorted(ALIASES)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.4)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ValueError(f"Unknown device '{name}'.{hint} Valid names: {', '.join(sorted(CATALOG))} "
                   f"(aliases: {', '.join(sorted(ALIASES))}).")
