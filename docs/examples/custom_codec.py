"""A codec of your own: booleans stored as one bit each (8 per byte), registered so that a spec
or a saved buffer naming it loads again.

A codec changes how a field is stored, never what is delivered: ``encode`` must be exact (the
buffer refuses a value it cannot store bit for bit), and ``decode`` gives back the field's own
dtype. ``@register_codec`` makes ``{"name": "bits", ...}`` in a spec's config rebuild this class.

Run it: ``python docs/examples/custom_codec.py``.
"""

import numpy as np
import torch

from conduit_core import Codec, CodecError, ExperienceBuffer, ExperienceSpec, FieldSpec, Uniform, register_codec


@register_codec
class BitsCodec(Codec):
    """A boolean vector of ``n`` entries stored in ``ceil(n / 8)`` uint8 bytes."""

    name = "bits"

    def __init__(self, *, n: int):
        self.n = int(n)

    def stored_shape(self, shape):
        return (*shape[:-1], (shape[-1] + 7) // 8)

    def stored_dtype(self, dtype):
        return torch.uint8

    def encode(self, field, x):
        a = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)   # validated columns: numpy or torch
        if a.dtype != np.bool_:
            raise CodecError(f"{field}: expected bools for the bits codec, got {a.dtype}")
        return np.packbits(a, axis=-1)

    def decode(self, stored, dtype):
        bits = np.unpackbits(stored.cpu().numpy(), axis=-1, count=self.n)
        return torch.from_numpy(bits.astype(bool)).to(stored.device)

    def to_config(self):
        return {"name": self.name, "n": self.n}   # from_config's default: BitsCodec(n=...)

    def __eq__(self, other):
        return isinstance(other, BitsCodec) and other.n == self.n

    def __hash__(self):
        return hash((self.name, self.n))


def spec_with_mask(n: int = 20) -> ExperienceSpec:
    return ExperienceSpec([FieldSpec("obs", (4,)), FieldSpec("mask", (n,), torch.bool, codec=BitsCodec(n=n))])


def main():
    spec = spec_with_mask()
    buf = ExperienceBuffer(spec=spec, capacity=100, selector=Uniform())
    rng = np.random.default_rng(0)
    masks = rng.random((10, 20)) < 0.5
    buf.add({"obs": rng.normal(size=(10, 4)).astype(np.float32), "mask": masks})
    batch = buf.sample(4)
    stored_bytes = spec.stored_bytes_per_transition
    again = ExperienceSpec.from_config(spec.to_config())     # the registry rebuilds BitsCodec
    buf.close()
    return batch, masks, stored_bytes, again == spec


if __name__ == "__main__":
    batch, masks, stored, same = main()
    print(batch["mask"].shape, batch["mask"].dtype, f"{stored} B a row stored", "config round trip:", same)
