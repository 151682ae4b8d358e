"""The experience spec: which fields a transition has, with their shape, dtype and codec.

A spec is the contract between an adapter and the buffer. Everything that enters the
buffer is checked against it once, at the ingestion boundary, so that the hot paths
behind it (write, gather, decode) never check again.

    spec = ExperienceSpec.transition(obs_shape=(4,), action_dtype=torch.int64,
                                     extras={"logp": ((), torch.float32)})
    spec.bytes_per_transition          # logical bytes, as the framework would hold them
    spec.stored_bytes_per_transition   # bytes after lossless codecs
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from ..errors import CodecError, SpecError
from .codecs import Codec, IdentityCodec, codec_from_config
from .shifted_rows import encode_shifted, shift_partners, shifted_pairs

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


_NP_DTYPES: dict[torch.dtype, np.dtype] = {t: np.dtype(n) for n, t in _DTYPES.items() if n != "bfloat16"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def as_torch_dtype(dtype: Any, *, field_name: str = "dtype") -> torch.dtype:
    """Accept a torch dtype, a numpy dtype or a name ('float32') and return the torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    except TypeError:
        name = str(dtype)
    if name in _DTYPES:
        return _DTYPES[name]
    raise SpecError(field_name, f"one of {sorted(_DTYPES)}", repr(dtype),
                    "pass a torch dtype such as torch.float32")


@dataclass(frozen=True)
class FieldSpec:
    """One named field of a transition: per-transition ``shape`` (without the batch dim),
    logical ``dtype`` and the lossless ``codec`` used to store it."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    codec: Codec = field(default_factory=IdentityCodec)
    allow_nonfinite: bool = False   # NaN/inf in a float field is refused at ingestion unless allowed
    # Which transition of an n-step window the field is delivered from: "first" (the window's first:
    # obs, action, ...) or "last" (its last: a field that looks one step ahead, as next_obs, or a
    # next_goal). None resolves to "last" for the field named next_obs, "first" for any other: declare
    # "last" for every other look-ahead field, or n-step windows would deliver its first step's value.
    window_step: str | None = None

    def __post_init__(self) -> None:
        parts = self.name.split(".") if isinstance(self.name, str) else [""]
        if not all(p.isidentifier() and not p.startswith("_") for p in parts):
            raise SpecError("field name", "Python identifiers not starting with '_', joined by '.' for nested "
                            "fields (e.g. 'obs' or 'obs.pixels')", repr(self.name),
                            "rename the field (names starting with '_' are reserved)")
        shape = tuple(int(s) for s in self.shape)
        if any(s <= 0 for s in shape):
            raise SpecError(f"{self.name}.shape", "positive dimensions", shape, "fix the shape")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", as_torch_dtype(self.dtype, field_name=f"{self.name}.dtype"))
        object.__setattr__(self, "_np_dtype", _NP_DTYPES.get(self.dtype))
        if self.window_step is None:
            object.__setattr__(self, "window_step", "last" if self.name == "next_obs" else "first")
        elif self.window_step not in ("first", "last"):
            raise SpecError(f"{self.name}.window_step", "'first' or 'last' (the transition of an n-step window "
                            "the field is delivered from)", repr(self.window_step),
                            "use 'last' for a field that looks one step ahead (next_obs, next_goal), else 'first'")
        self.codec.check_compatible(self)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """Logical bytes per transition (as the framework holds the field)."""
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def np_dtype(self) -> np.dtype | None:
        """The numpy dtype of the logical dtype (None for bfloat16, which numpy lacks)."""
        return self._np_dtype

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return self.codec.stored_shape(self.shape)

    @property
    def stored_dtype(self) -> torch.dtype:
        return self.codec.stored_dtype(self.dtype)

    @property
    def stored_bytes(self) -> int:
        return math.prod(self.stored_shape) * torch.empty((), dtype=self.stored_dtype).element_size()

    def to_config(self) -> dict:
        cfg = {"name": self.name, "shape": list(self.shape), "dtype": dtype_name(self.dtype),
               "codec": self.codec.to_config()}
        if self.allow_nonfinite:
            cfg["allow_nonfinite"] = True
        if self.window_step != ("last" if self.name == "next_obs" else "first"):
            cfg["window_step"] = self.window_step
        return cfg

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> "FieldSpec":
        return FieldSpec(cfg["name"], tuple(cfg["shape"]), _DTYPES[cfg["dtype"]],
                         codec_from_config(cfg["codec"]), bool(cfg.get("allow_nonfinite", False)),
                         cfg.get("window_step"))


class ExperienceSpec:
    """An ordered set of :class:`FieldSpec`; validates batches at the ingestion boundary."""

    def __init__(self, fields: Iterable[FieldSpec]):
        self.fields: dict[str, FieldSpec] = {}
        for f in fields:
            if not isinstance(f, FieldSpec):
                raise SpecError("fields", "FieldSpec instances", type(f).__name__,
                                "build each field with FieldSpec(name, shape, dtype)")
            if f.name in self.fields:
                raise SpecError("fields", "unique names", f"{f.name!r} twice", "remove the duplicate")
            self.fields[f.name] = f
        if not self.fields:
            raise SpecError("fields", "at least one field", "none", "declare the fields of a transition")
        self._native_check = _native_check_plan(self.fields.values())
        self._native_check_encoding = _native_check_plan(self.fields.values(), codec_refuses=True)
        self._all_identity = all(f.codec.is_identity for f in self.fields.values())
        self.shift_partners = shift_partners(self.fields.values())

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a process worker's copy, an older checkpoint): the derived plan is rebuilt
        in this process, where numpy's dtype instances are not the pickled ones."""
        self.__dict__.update(state)
        self._native_check = _native_check_plan(self.fields.values())
        self._native_check_encoding = _native_check_plan(self.fields.values(), codec_refuses=True)
        self._all_identity = all(f.codec.is_identity for f in self.fields.values())
        self.shift_partners = shift_partners(self.fields.values())

    # ----------------------------------------------------------------- presets
    @classmethod
    def transition(cls, *, obs_shape: tuple[int, ...], obs_dtype: Any = torch.float32,
                   action_shape: tuple[int, ...] = (), action_dtype: Any = torch.int64,
                   next_obs: bool = True, obs_codec: Codec | None = None,
                   extras: Mapping[str, tuple[tuple[int, ...], Any]] | None = None) -> "ExperienceSpec":
        """The usual (obs, action, reward, next_obs, terminated, truncated) transition."""
        codec = obs_codec or IdentityCodec()
        fields = [FieldSpec("obs", obs_shape, obs_dtype, codec),
                  FieldSpec("action", action_shape, action_dtype),
                  FieldSpec("reward", (), torch.float32)]
        if next_obs:
            fields.append(FieldSpec("next_obs", obs_shape, obs_dtype, codec))
        fields += [FieldSpec("terminated", (), torch.bool), FieldSpec("truncated", (), torch.bool)]
        for name, (shape, dtype) in (extras or {}).items():
            fields.append(FieldSpec(name, shape, dtype))
        return cls(fields)

    # ------------------------------------------------------------- properties
    def __iter__(self):
        return iter(self.fields.values())

    def __getitem__(self, name: str) -> FieldSpec:
        return self.fields[name]

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExperienceSpec) and self.to_config() == other.to_config()

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}{list(f.shape)}:{dtype_name(f.dtype)}" for f in self)
        return f"ExperienceSpec({inner})"

    @property
    def names(self) -> list[str]:
        return list(self.fields)

    @property
    def bytes_per_transition(self) -> int:
        """Logical bytes per transition, i.e. without codecs."""
        return sum(f.bytes for f in self)

    @property
    def stored_bytes_per_transition(self) -> int:
        """Bytes per transition as stored, after the lossless codecs."""
        return sum(f.stored_bytes for f in self)

    def to_config(self) -> list[dict]:
        return [f.to_config() for f in self]

    @classmethod
    def from_config(cls, cfg: Iterable[Mapping[str, Any]]) -> "ExperienceSpec":
        return cls(FieldSpec.from_config(c) for c in cfg)

    # ------------------------------------------------------------- validation
    def encode(self, columns: Mapping[str, Any]) -> dict[str, Any]:
        """Validated columns (``validate``'s second value) in their stored form: each field
        through its codec (identity fields pass as they are). The one encode step every
        ingestion path uses (inline, thread or process worker, ``ExperienceBuffer.add``)."""
        if self._all_identity:
            return dict(columns)
        out = {}
        shifted = shifted_pairs(self, columns)   # obs and next_obs as one array's rows [:-1] and [1:]
        partners = {partner for partner, _ in shifted.values()}   # encoded with their pair, in whatever order
        for name, c in columns.items():
            if name in out or name in partners:
                continue
            codec = self[name].codec
            if codec.is_identity:
                out[name] = c
            elif name in shifted:
                partner, union = shifted[name]
                out.update(encode_shifted(codec, name, partner, c, columns[partner], union))
            else:
                out[name] = codec.encode(name, c)
        return out

    def native_row_check(self) -> tuple | None:
        """The plan ``_rows.check_columns(batch, plan)`` checks a batch against where every
        field is stored as it comes (no codec), else None; its answer is ``validate``'s."""
        return self._native_check if self._all_identity else None

    def validate_and_encode(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """``validate`` then ``encode``: (rows, stored columns); stores nothing. A field whose
        verified codec refuses NaN/inf in its own pass (``Codec.refuses_nonfinite``) is not
        read for them first (an Atari stack is read once, not twice); such a value gets
        ``validate``'s error all the same."""
        if self._all_identity:
            if self._native_check is not None and type(batch) is dict:   # (validate's first step, inline)
                checked = _c_check_columns(batch, self._native_check)
                if checked is not None:
                    return checked
            return self.validate(batch)   # validate's dict is a fresh one
        n, cols = self.validate(batch, _codec_checks_finite=True)
        try:
            return n, self.encode(cols)
        except CodecError:
            for name, f in self.fields.items():   # a NaN or inf is named as validate names it
                if f.dtype.is_floating_point and not f.allow_nonfinite and f.codec.refuses_nonfinite and n:
                    _check_finite(name, cols[name])
            raise

    def validate(self, batch: Mapping[str, Any], *,
                 _codec_checks_finite: bool = False) -> tuple[int, dict[str, torch.Tensor]]:
        """Check a batch of transitions (dict of arrays with a leading batch dim).

        Returns ``(n, columns)``; columns stay what they were (numpy array or torch
        tensor), so nothing is copied or converted on the hot path. Raises :class:`SpecError` naming the field, the
        expected and actual value and the fix. Nothing is stored by this call.
        """
        plan = self._native_check_encoding if _codec_checks_finite else self._native_check
        if plan is not None and type(batch) is dict:
            checked = _c_check_columns(batch, plan)
            if checked is not None:   # the whole check in one C call; else the route below names the error
                return checked
        if not isinstance(batch, Mapping):
            raise SpecError("batch", "a mapping of field name -> array", type(batch).__name__,
                            "pass a dict such as {'obs': obs, 'action': action, ...}")
        missing = [n for n in self.fields if n not in batch]
        if missing:
            raise SpecError(missing[0], "present in the batch", "missing",
                            f"add the field(s) {missing} or remove them from the ExperienceSpec")
        unknown = [k for k in batch if k not in self.fields]
        if unknown:
            raise SpecError(str(unknown[0]), f"one of the spec's fields {self.names}", "an unknown field",
                            "declare it in the ExperienceSpec (e.g. as an extra) or drop it from the batch")
        columns: dict[str, Any] = {}
        n = None
        for name, f in self.fields.items():
            col = batch[name]
            if isinstance(col, np.ndarray):
                dtype_ok = col.dtype == f.np_dtype
            elif isinstance(col, torch.Tensor):
                dtype_ok = col.dtype == f.dtype
            else:
                raise SpecError(name, "a numpy array or torch tensor", type(col).__name__,
                                "convert it with np.asarray(...) first; Python lists are not accepted on the hot path")
            if col.ndim != len(f.shape) + 1 or tuple(col.shape[1:]) != f.shape:
                raise SpecError(name, f"shape [N, {', '.join(map(str, f.shape))}]".replace(", ]", "]"),
                                list(col.shape),
                                "give every field a leading batch dimension N and the per-transition "
                                f"shape {list(f.shape)} declared in the spec")
            if not dtype_ok:
                actual_dtype = str(col.dtype) if isinstance(col, np.ndarray) else dtype_name(col.dtype)
                raise SpecError(name, f"dtype {dtype_name(f.dtype)}", actual_dtype,
                                f"cast it, e.g. x.astype(np.{dtype_name(f.dtype)}) or "
                                f"x.to(torch.{dtype_name(f.dtype)}), or declare dtype "
                                f"{actual_dtype} in the spec")
            if _reads_for_nonfinite(f, _codec_checks_finite) and col.shape[0]:
                _check_finite(name, col)
            if n is None:
                n = col.shape[0]
            elif col.shape[0] != n:
                raise SpecError(name, f"batch size {n} (as the first field)", col.shape[0],
                                "give every field the same number of transitions")
            columns[name] = col
        return int(n or 0), columns


try:
    from .._native._scan import all_finite as _c_all_finite
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_all_finite = None
try:
    from .._native._rows import check_columns as _c_check_columns
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_check_columns = None


def _native_check_plan(fields, *, codec_refuses: bool = False) -> tuple | None:
    """What ``_rows.check_columns`` checks a batch against: per field (name, numpy dtype,
    per-row shape, the float itemsize whose values must be finite, or 0). None when the C
    helper is missing or a field has no numpy dtype (bfloat16): ``validate`` then checks in Python."""
    if _c_check_columns is None or any(f.np_dtype is None for f in fields):
        return None
    # np.dtype(str) is numpy's own instance for the type, the one most arrays of it carry (the C
    # check compares identity first; an unpickled array's dtype is an equal copy, checked for equality)
    return tuple((f.name, np.dtype(f.np_dtype.str), tuple(int(d) for d in f.shape),
                  f.np_dtype.itemsize if _reads_for_nonfinite(f, codec_refuses) else 0)
                 for f in fields)


def _reads_for_nonfinite(f, codec_refuses: bool = False) -> bool:
    """Whether validation reads a field for NaN/inf: a float field that does not allow them,
    unless (``codec_refuses``: the encode follows in the same call) its codec refuses them in
    its own pass, as a verified affine encode does."""
    return f.dtype.is_floating_point and not f.allow_nonfinite and not (codec_refuses and f.codec.refuses_nonfinite)


def _check_finite(name: str, col) -> None:
    """Refuse NaN/inf: one reduction over the column (a finite sum means no NaN or inf);
    only a non-finite sum, overflow included, pays the exact element check."""
    if isinstance(col, torch.Tensor):
        if bool(torch.isfinite(col.sum())) or bool(torch.isfinite(col).all()):
            return
        bad = int(torch.nonzero(~torch.isfinite(col.reshape(col.shape[0], -1)).all(dim=1))[0])
        value = col.reshape(col.shape[0], -1)[bad][~torch.isfinite(col.reshape(col.shape[0], -1)[bad])][0].item()
    else:
        if _c_all_finite is not None and col.dtype.kind == "f" and col.flags.c_contiguous:
            if _c_all_finite(col):   # one read of the bits, in C
                return
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                if np.isfinite(col.sum()) or np.isfinite(col).all():
                    return
        flat = col.reshape(col.shape[0], -1)
        bad = int(np.flatnonzero(~np.isfinite(flat).all(axis=1))[0])
        value = flat[bad][~np.isfinite(flat[bad])][0]
    raise SpecError(name, "finite values", f"{value} in row {bad}",
                    f"fix the producer (NaN usually means a diverged model or a broken env), or declare "
                    f"FieldSpec({name!r}, ..., allow_nonfinite=True) if non-finite values are data")


def as_tensor(x: Any) -> torch.Tensor:
    """A torch view of a validated column (numpy arrays are wrapped without a copy)."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(x if x.flags.writeable else x.copy())
