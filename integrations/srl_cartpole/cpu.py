"""CPU shims for running SRL's workers on a machine without CUDA (checked against SRL b3b01ea).

Applied in the launching process before SRL forks its workers (the workers inherit the patched
names); nothing in SRL's tree changes, and nothing is patched when ``torch.cuda.is_available()``:

- ``rlsrl/system/__init__.py:71``: ``run_worker`` calls ``torch.cuda.init()`` in every worker, which
  raises without CUDA ("Torch not compiled with CUDA enabled"): a no-op here.
- ``rlsrl/api/trainer.py:183-214``: MAPPO (``rlsrl/legacy/algorithm/ppo/mappo.py:12`` imports the name,
  ``:116`` builds it) prefetches each batch to the GPU on a ``torch.cuda.Stream()``: replaced by
  :class:`CPUPrefetcher`, the same one-step delay (the first ``push`` returns None, every later one
  returns the previous sample with its tensors) without a stream or a device copy.
- ``rlsrl/base/buffer.py:238,389``: SRL's replay buffers pin their storage (``pin_memory()`` raises
  "Cannot access accelerator device when none is available"): pinning has no meaning without an
  accelerator, so ``Tensor.pin_memory`` returns the tensor itself.
"""

from __future__ import annotations

import torch

_saved: dict = {}


class CPUPrefetcher:
    """``PyTorchGPUPrefetcher``'s interface and one-step delay, on the CPU.

    ``push(sample)`` keeps ``sample`` and float32 copies of its arrays (the GPU prefetcher's device copy,
    on the host) and returns the previous pair, or None on the first call."""

    def __init__(self):
        self.nex_numpy_sample = None
        self.nex_torch_sample = None
        self.initialized_prefetching = False

    def _preload(self, sample):
        from rlsrl.base.namedarray import recursive_apply
        self.nex_numpy_sample = sample
        # a copy, as the GPU prefetcher's device copy is: the batch outlives the buffer's get (SRL's
        # trainer thread may get and skip stale samples while this one waits for its step)
        self.nex_torch_sample = recursive_apply(sample, lambda x: torch.tensor(x, dtype=torch.float32))

    def push(self, sample):
        if not self.initialized_prefetching:
            self._preload(sample)
            self.initialized_prefetching = True
            return None
        numpy_sample, torch_sample = self.nex_numpy_sample, self.nex_torch_sample
        self._preload(sample)
        return numpy_sample, torch_sample


def _cuda_init_noop():
    return None


def _pin_memory_noop(self, *args, **kwargs):
    return self


def applied() -> bool:
    return bool(_saved)


def apply(force: bool = False) -> bool:
    """Patch SRL's CUDA-only call sites (idempotent). Returns True when the shims are in place,
    False when CUDA is available (then nothing is patched, unless ``force``)."""
    if _saved:
        return True
    if torch.cuda.is_available() and not force:
        return False
    import rlsrl.api.trainer as trainer_api
    import rlsrl.legacy.algorithm.ppo.mappo as mappo
    _saved.update(cuda_init=torch.cuda.init, pin_memory=torch.Tensor.pin_memory,
                  trainer_prefetcher=trainer_api.PyTorchGPUPrefetcher, mappo_prefetcher=mappo.PyTorchGPUPrefetcher)
    torch.cuda.init = _cuda_init_noop
    torch.Tensor.pin_memory = _pin_memory_noop
    trainer_api.PyTorchGPUPrefetcher = CPUPrefetcher
    mappo.PyTorchGPUPrefetcher = CPUPrefetcher
    return True


def remove() -> None:
    """Undo :func:`apply` in this process."""
    if not _saved:
        return
    import rlsrl.api.trainer as trainer_api
    import rlsrl.legacy.algorithm.ppo.mappo as mappo
    torch.cuda.init = _saved["cuda_init"]
    torch.Tensor.pin_memory = _saved["pin_memory"]
    trainer_api.PyTorchGPUPrefetcher = _saved["trainer_prefetcher"]
    mappo.PyTorchGPUPrefetcher = _saved["mappo_prefetcher"]
    _saved.clear()
