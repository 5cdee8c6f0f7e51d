"""Where a runner computes and in what precision: the configured device and
dtype resolved against this machine, the device of each tensor-parallel
rank, the CPU cores the ranks share, and the memory a device has free."""
import os
from contextlib import contextmanager

import torch

from tracengine.errors import ConfigError
from tracengine.model.loader import checkpoint_dtype

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA devices exist")
    return device


def resolve_dtype(name: str, device: torch.device, hf_config) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32   # half-precision matmuls on the CPU are slow and no smaller in practice
    return checkpoint_dtype(hf_config) or torch.bfloat16


def rank_device(device: torch.device, rank: int, size: int) -> torch.device:
    """Rank r runs on the r-th CUDA device from the configured one; the CPU is shared."""
    if device.type != "cuda" or size == 1:
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def cpu_threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """The bytes an allocation on `device` can take now, and what says so: on CUDA the driver's
    free memory and what torch's allocator holds unused; on the CPU the kernel's MemAvailable
    (what it can give without swapping), else the physical memory. None where nothing says."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), f"{device} free"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (AttributeError, ValueError, OSError):
        return None


@contextmanager
def default_dtype(dtype: torch.dtype):
    # Parameters are created with torch.empty; this gives them the model dtype
    # without a float32 copy first. Restored at once: no lasting global change.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
