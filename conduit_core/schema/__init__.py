"""Schema: what a transition is (``ExperienceSpec``: fields with shape, dtype and codec), how a
field is stored (codecs, frame stacks stored once per frame, a field that is another shifted by
one row) and what delivery hands a learner (``Batch``)."""

from .batch import Batch
from .codecs import AffineCodec, Codec, ColumnDecoder, IdentityCodec, StoredDecoder, codec_from_config, register_codec
from .framestack import FrameStackCodec
from .spec import ExperienceSpec, FieldSpec

__all__ = ["AffineCodec", "Batch", "Codec", "ColumnDecoder", "ExperienceSpec", "FieldSpec", "FrameStackCodec",
           "IdentityCodec", "StoredDecoder", "codec_from_config", "register_codec"]
