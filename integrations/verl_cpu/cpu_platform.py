"""A CPU platform for verl's platform layer, and the two call sites that still assume an accelerator.

Why this exists (verl 0.9.1, paths under verl/):
- verl ships platforms for nvidia, huawei (npu) and rocm only. With no GPU, auto-detection falls back
  to nvidia (plugin/platform/platform_manager.py:114, "Falling back to 'nvidia'"), and
  `auto_set_device` rewrites `trainer.device=cpu` to the detected device (utils/device.py:151).
  `PlatformCPU` is registered as "cpu" and installed with `set_platform`; `VERL_PLATFORM=cpu`
  (set by run.py) makes every process resolve to it even if something asked earlier.
- Its Ray resource stays "GPU": the worker groups demand accelerator slots
  (single_controller/ray/base.py:148,210,241, "Total available GPUs 0 is less than total desired
  GPUs 1"), so run.py gives Ray fake ones (`+ray_kwargs.ray_init.num_gpus=1`). Nothing runs on them.
- `device_module` is `CPUDeviceModule`: `torch.cpu` lacks empty_cache, mem_get_info, manual_seed,
  get_device_name ... which verl calls through `get_torch_device()` on every path. The stubs are
  no-ops or report "no device memory". `get_device_name()` returns "CPU" because
  utils/flops_counter.py:80 calls it on anything that is not exactly `torch.cpu`.
- The process group: utils/distributed.py:89 builds `f"cpu:gloo,{device}:{backend}"`, which on CPU is
  "cpu:gloo,cpu:gloo" and torch rejects the duplicate device type ("Duplicate device type cpu in
  backend string"). `install()` wraps `initialize_global_process_group_ray` so a missing backend
  means plain "gloo". It is imported by name in workers/engine_workers.py:38, so the wrap must be in
  place before that module is imported: `import verl` loads this module first (verl/__init__.py:49).
"""

from __future__ import annotations

import functools
import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import torch

PLATFORM_NAME = "cpu"


class CPUDeviceModule(types.ModuleType):
    """`torch.cpu` plus the `torch.cuda`-style calls verl makes on whatever device module it has."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        # Everything torch.cpu has (synchronize, Stream, Event, current_stream, stream, ...).
        return getattr(torch.cpu, name)

    # Device management
    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"

    # Memory: there is no device memory to free or to measure.
    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return (0, 0)

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    # RNG: the CPU generator is torch's default generator.
    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


def _platform_class():
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl platform for a CPU-only host: device "cpu", backend gloo, Ray resource "GPU" (fake slots)."""

        _module = CPUDeviceModule()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return self._module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

        def current_device(self) -> str:
            # A string on purpose: verl moves tensors with `.to(get_device_id())`
            # (e.g. workers/engine/fsdp/transformer_impl.py:730,935) and `.to(0)` means cuda:0.
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: Optional[int] = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformCPU


def _gloo_by_default(init_fn):
    @functools.wraps(init_fn)
    def init(timeout_second=None, backend=None):
        return init_fn(timeout_second=timeout_second, backend=backend or "gloo")

    init.__verl_cpu_patched__ = True
    return init


def install() -> None:
    """Register and select the CPU platform and patch the process-group default. Idempotent."""
    from verl.plugin.platform import PlatformRegistry, set_platform
    from verl.plugin.platform import platform_manager
    import verl.utils.distributed as dist_utils

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
    current = platform_manager._current_platform
    if current is None or current.device_name != "cpu":
        set_platform(PlatformRegistry.get(PLATFORM_NAME)())
    if not getattr(dist_utils.initialize_global_process_group_ray, "__verl_cpu_patched__", False):
        dist_utils.initialize_global_process_group_ray = _gloo_by_default(
            dist_utils.initialize_global_process_group_ray
        )
