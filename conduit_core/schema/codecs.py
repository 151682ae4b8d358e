"""Lossless per-field codecs: capacity is part of placement.

A codec changes how a field is *stored*, never what is *delivered*: every encode is
checked by decoding and comparing bit for bit, and a value the codec cannot represent
exactly is rejected with :class:`CodecError` (so a lossy store can never happen
silently). Decoding runs after the gather, on the learner's device when there is one,
so the bytes that cross a link are the small stored ones.

Example: Atari observations that a framework normalises to float32 ``k / 255`` take
4 bytes per pixel; ``AffineCodec.divide(255)`` stores the same information in 1 byte.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch

from ..errors import CodecError, SpecError

try:
    from .._native._affine import decode_u8 as _c_decode_u8
    from .._native._affine import quantize_u8 as _c_quantize_u8
except ImportError:  # pragma: no cover - no C compiler where it was installed: the numpy route
    _c_decode_u8 = _c_quantize_u8 = None

if TYPE_CHECKING:  # pragma: no cover
    from .spec import FieldSpec

_INT_RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767)}
_NP_STORED = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (a float's -0.0 is not +0.0), as the affine codec's check must be."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = _BITS[a.element_size()]
    return torch.equal(a.view(bits), b.view(bits))


class Codec(ABC):
    """Stored representation of one field. Encode is verified exact; decode is pure."""

    name: str = "abstract"

    @abstractmethod
    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]: ...

    @abstractmethod
    def stored_dtype(self, dtype: torch.dtype) -> torch.dtype: ...

    @abstractmethod
    def encode(self, field: str, x: torch.Tensor) -> torch.Tensor:
        """Return the stored form of ``x``; raise CodecError if it is not exactly representable."""

    @abstractmethod
    def decode(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...

    @abstractmethod
    def to_config(self) -> dict:
        """A JSON-able dict with this codec's ``name``: what ``from_config`` rebuilds it from."""

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Codec":
        """The codec ``to_config`` described: by default its keyword arguments are the config's
        other keys. A codec whose config holds more than plain values (a dtype's name) overrides this."""
        return cls(**{k: v for k, v in cfg.items() if k != "name"})

    def check_compatible(self, field: "FieldSpec") -> None:
        """Raise SpecError when the codec cannot apply to ``field`` (called by FieldSpec)."""

    @property
    def is_identity(self) -> bool:
        return False

    @property
    def refuses_nonfinite(self) -> bool:
        """Whether ``encode`` refuses NaN and infinities itself (a verified round trip into
        integers cannot hold them), so validation need not read the column for them first."""
        return False

    @property
    def rowwise_encode(self) -> bool:
        """Whether ``encode`` maps each row on its own (row i of the output depends on row i of
        the input only): rows shared by two fields may then be encoded once."""
        return False

    @property
    def frame_pool(self) -> str | None:
        """The storage-side pool this codec's stored values point into (a frame-stacking codec's
        ids into frames shared between stacks), or None: each stored row holds its value whole.
        The storage builds one pool per name for the fields that share it."""
        return None

    def storage_decoder(self, pools: Mapping[str, Any]) -> "StoredDecoder":
        """How a storage turns this field's stored rows into delivered ones, given the storage's
        frame pools by name. The codec decides, so a storage asks no codec what class it is."""
        return ColumnDecoder(self)


class StoredDecoder(ABC):
    """Decodes one field's gathered stored rows for a target device; made by the field's codec
    (``Codec.storage_decoder``) once per storage."""

    #: whether the stored rows must stay on the host and the decoder alone moves the result to
    #: the target (stored values that point into a host-side pool); else the storage moves the
    #: stored rows to the target first, so the small stored form crosses the link
    keeps_stored_on_host: bool = False

    @abstractmethod
    def decode(self, stored: torch.Tensor, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        """The delivered rows of ``stored`` (already on ``device`` unless ``keeps_stored_on_host``)."""


class ColumnDecoder(StoredDecoder):
    """A self-contained stored column: the codec's own ``decode``, where the rows already are."""

    def __init__(self, codec: Codec):
        self.codec = codec

    def decode(self, stored: torch.Tensor, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
        return self.codec.decode(stored, dtype)


class IdentityCodec(Codec):
    name = "identity"

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def stored_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def encode(self, field: str, x: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        return x

    def decode(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return stored

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name}

    @property
    def is_identity(self) -> bool:
        return True

    def __eq__(self, other):
        return isinstance(other, IdentityCodec)

    def __hash__(self):
        return hash(self.name)


class AffineCodec(Codec):
    """Floats that are an affine image of small integers: ``x = q * scale + offset`` or,
    with ``divisor``, ``x = q / divisor + offset`` (the exact float op matters for
    bit-exactness: ``q / 255`` and ``q * (1/255)`` differ in the last bit).

    Stored as ``stored`` (uint8 by default). Every encode is verified by decoding.
    """

    name = "affine"

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "AffineCodec":
        return cls(scale=cfg["scale"], offset=cfg["offset"], divisor=cfg["divisor"], stored=_STORED[cfg["stored"]],
                   verify=cfg.get("verify", True))

    def __init__(self, *, scale: float = 1.0, offset: float = 0.0, divisor: float | None = None,
                 stored: torch.dtype = torch.uint8, verify: bool = True):
        if stored not in _INT_RANGES:
            raise SpecError("AffineCodec.stored", f"one of {list(_INT_RANGES)}", stored,
                            "store as torch.uint8, torch.int8 or torch.int16")
        if divisor is not None and divisor == 0:
            raise SpecError("AffineCodec.divisor", "non-zero", divisor, "use e.g. divisor=255")
        if divisor is None and scale == 0:
            raise SpecError("AffineCodec.scale", "non-zero", scale, "use e.g. scale=1/255")
        self.scale, self.offset, self.divisor = float(scale), float(offset), divisor
        self.stored, self.verify = stored, verify

    @classmethod
    def divide(cls, divisor: float, *, offset: float = 0.0, stored: torch.dtype = torch.uint8) -> "AffineCodec":
        """The codec for frameworks that normalise pixels as ``x / divisor``."""
        return cls(divisor=float(divisor), offset=offset, stored=stored)

    @property
    def refuses_nonfinite(self) -> bool:
        return self.verify   # NaN or inf never decodes back from an integer: the check refuses it

    @property
    def rowwise_encode(self) -> bool:
        return True   # elementwise

    def check_compatible(self, field: FieldSpec) -> None:
        if not field.dtype.is_floating_point:
            raise SpecError(f"{field.name}.codec", "a floating-point field for AffineCodec",
                            field.dtype, "drop the codec; integer fields can be declared uint8 directly")

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def stored_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.stored

    def encode(self, field: str, x: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return self._encode_torch(field, x)
        xn = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        if self.verify and xn.dtype == np.float32 and xn.flags.c_contiguous and self._native_ok():
            return self._encode_native(field, xn)
        xf = xn if xn.dtype in (np.float32, np.float64) else xn.astype(np.float32)
        lo, hi = _INT_RANGES[self.stored]
        if self.divisor is not None:
            q = np.rint((xf - xf.dtype.type(self.offset)) * xf.dtype.type(self.divisor))
        else:
            q = np.rint((xf - xf.dtype.type(self.offset)) / xf.dtype.type(self.scale))
        q = np.clip(q, lo, hi).astype(_NP_STORED[self.stored])
        if self.verify:   # bit for bit: -0.0 decoded as +0.0 is a change too
            back = self._decode_numpy(q, xn.dtype)
            bits = f"u{xn.dtype.itemsize}"
            if not np.array_equal(back.view(bits), xn.view(bits)):
                self._reject(field, xn, back, tuple(np.argwhere(back.view(bits) != xn.view(bits))[0].tolist()))
        return torch.from_numpy(q)

    def _native_ok(self) -> bool:
        """Whether the one-pass C encode applies: uint8 storage, and a C decode equal to this
        codec's lookup table for all 256 values, bit for bit (checked once per codec; a
        power-of-two divisor decodes by multiplying with its reciprocal, the same 256 values)."""
        if "_native_args" not in self.__dict__:
            args = None
            if _c_quantize_u8 is not None and self.stored == torch.uint8:
                quantise = (True, self.divisor) if self.divisor is not None else (False, self.scale)
                decodes = ([(True, 1.0 / self.divisor), (False, self.divisor)] if self.divisor is not None
                           else [(True, self.scale)])
                want = self._lut(torch.float32).view(np.uint32).tobytes()
                for dmul, df in decodes:
                    back = np.empty(256, dtype=np.float32)
                    _c_decode_u8(np.arange(256, dtype=np.uint8), self.offset, dmul, df, back)
                    if back.view(np.uint32).tobytes() == want:
                        args = (self.offset, *quantise, dmul, df)
                        break
            self.__dict__["_native_args"] = args
        return self.__dict__["_native_args"] is not None

    def _encode_native(self, field, xn: np.ndarray):
        """float32 -> uint8 with the exactness check, one pass in C: the same float32 operations
        as the numpy route (so the same q), checked against the same decode."""
        q = np.empty(xn.shape, dtype=np.uint8)
        bad = _c_quantize_u8(xn, *self.__dict__["_native_args"], q)
        if bad >= 0:
            self._reject(field, xn, self._decode_numpy(q, xn.dtype), tuple(np.unravel_index(bad, xn.shape)))
        return torch.from_numpy(q)

    def _reject(self, field, xn, back, bad):
        raise CodecError(
            f"{field}: the affine codec ({self._formula()}) cannot represent value "
            f"{xn[bad]!r} at index {[int(i) for i in bad]} exactly (it would decode to {back[bad]!r}); the batch "
            "was rejected and nothing was stored. Fix: remove obs_codec / the field's codec, or "
            "choose the scale/divisor that produced the data.")

    def _encode_torch(self, field, x):
        xf = x.to(torch.float32) if x.dtype != torch.float64 else x
        if self.divisor is not None:
            q = torch.round((xf - self.offset) * self.divisor)
        else:
            q = torch.round((xf - self.offset) / self.scale)
        lo, hi = _INT_RANGES[self.stored]
        q = q.clamp_(lo, hi).to(self.stored)
        if self.verify and not _same_bits(self._decode_arith(q, x.dtype), x):
            raise CodecError(f"{field}: the affine codec ({self._formula()}) cannot represent the batch exactly; "
                             "it was rejected and nothing was stored. Fix: remove the field's codec.")
        return q

    def _decode_arith(self, stored, dtype):
        """The definition of decoding (the lookup table is built from it, value by value)."""
        y = stored.to(dtype)
        if self.divisor is not None:
            y = y / self.divisor
        elif self.scale != 1.0:
            y = y * self.scale
        if self.offset:
            y = y + self.offset
        return y

    def decode_into(self, out: torch.Tensor, stored_view: torch.Tensor) -> torch.Tensor:
        """Decode a (possibly strided) stored view into ``out``. Where the scale is a power of
        two (``q / 128 - 1``, RLlib's Atari frames; ``q / 256``), ``q * scale + offset`` is
        exact for every q, so it runs as one fused pass (read q, write x); otherwise one
        cast-and-copy pass, then the arithmetic in place. Both bit-identical to ``decode``."""
        fused = self._fused(out.dtype)
        if fused is not None:
            alpha, offset = fused
            return torch.add(offset, stored_view, alpha=alpha, out=out)
        out.copy_(stored_view)
        if self.divisor is not None:
            out.div_(self.divisor)
        elif self.scale != 1.0:
            out.mul_(self.scale)
        if self.offset:
            out.add_(self.offset)
        return out

    def _fused(self, dtype: torch.dtype):
        """(alpha, offset tensor) when ``offset + alpha * q`` equals the decoding for every
        stored q (alpha a power of two: every product exact), checked value by value against
        the lookup table once per dtype; else None."""
        cache = self.__dict__.setdefault("_fused_cache", {})
        if dtype in cache:
            return cache[dtype]
        alpha = 1.0 / self.divisor if self.divisor is not None else self.scale
        mant, _ = math.frexp(abs(alpha)) if alpha else (0.0, 0)
        result = None
        if dtype.is_floating_point and mant == 0.5:
            lo, hi = _INT_RANGES[self.stored]
            offset = torch.tensor(self.offset, dtype=dtype)
            q = torch.arange(lo, hi + 1).to(self.stored)
            got = torch.add(offset, q, alpha=alpha)
            want = self._decode_arith(q, dtype)
            if got.dtype == dtype and _same_bits(got.view(-1), want.view(-1)):
                result = (alpha, offset)
        cache[dtype] = result
        return result

    def _lut(self, dtype: torch.dtype) -> np.ndarray:
        """decode(q) for every q of the stored type, indexed by q - min: one gather decodes
        a batch in a single pass, bit-identical to the arithmetic (same ops per value)."""
        luts = self.__dict__.setdefault("_luts", {})
        lut = luts.get(dtype)
        if lut is None:
            lo, hi = _INT_RANGES[self.stored]
            lut = luts[dtype] = self._decode_arith(torch.arange(lo, hi + 1).to(self.stored), dtype).numpy()
        return lut

    def _decode_numpy(self, q: np.ndarray, np_dtype) -> np.ndarray:
        dtype = torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype
        lut = self._lut(dtype)
        if self.stored == torch.uint8:
            return lut.take(q)
        return lut.take(q.astype(np.int32) - _INT_RANGES[self.stored][0])

    def decode(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if stored.device.type == "cpu" and dtype in (torch.float32, torch.float64):
            return torch.from_numpy(self._decode_numpy(stored.numpy(), torch.empty(0, dtype=dtype).numpy().dtype))
        return self._decode_arith(stored, dtype)

    def _formula(self) -> str:
        core = f"q / {self.divisor:g}" if self.divisor is not None else f"q * {self.scale:g}"
        return f"x = {core} + {self.offset:g}, q in {dtype_str(self.stored)}"

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale, "offset": self.offset,
                "divisor": self.divisor, "stored": dtype_str(self.stored), "verify": self.verify}

    def __eq__(self, other):
        return isinstance(other, AffineCodec) and self.to_config() == other.to_config()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_luts", "_fused_cache", "_native_args")}

    def __hash__(self):
        return hash(tuple(sorted(self.to_config().items())))


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_STORED = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16}

# name -> codec class: how a saved spec finds the codec its config names (``register_codec``)
_CODECS: dict[str, type[Codec]] = {}


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make ``cls`` the codec that a config ``{"name": cls.name, ...}`` rebuilds
    (``ExperienceSpec.from_config``, a saved buffer's state). The codecs the core ships register
    themselves; a codec of your own registers the same way, before a spec that names it is loaded."""
    if not (isinstance(cls, type) and issubclass(cls, Codec)) or cls.name in ("", "abstract"):
        raise SpecError("register_codec", "a Codec subclass with its own `name`", repr(cls),
                        "subclass conduit_core.Codec and set name = 'my_codec'")
    held = _CODECS.get(cls.name)
    if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise SpecError(f"{cls.__name__}.name", "a name no other codec has", repr(cls.name),
                        f"rename it: {held.__module__}.{held.__qualname__} is registered as {cls.name!r}")
    _CODECS[cls.name] = cls
    return cls


def codec_from_config(cfg: Mapping[str, Any]) -> Codec:
    """The codec a ``Codec.to_config()`` describes, rebuilt by the class registered under its name."""
    name = cfg.get("name")
    if name not in _CODECS:
        raise SpecError("codec.name", f"one of the registered codecs {sorted(_CODECS)}", repr(name),
                        "import the module that defines that codec (@register_codec) before loading the spec")
    return _CODECS[name].from_config(cfg)


register_codec(IdentityCodec)
register_codec(AffineCodec)
