"""Conduit for SRL (openpsi-projects/srl at b3b01ea), without editing SRL.

One call, in the process that launches SRL's workers (before they fork)::

    import conduit_srl
    conduit_srl.enable()          # SRL's make_buffer now builds Conduit's buffers
    rlsrl.apps.main.main()        # srl-local run -e ... -f ...

Stage map (SRL stage -> Conduit control point):

    sample stream -> buffer.put()  (trainer main thread) --> ingestion  (flatten once, one strided copy per
                                                                          field into the entry's [T, B] slot)
    buffer.get() (training thread) ------------------------> delivery   (reuse / overflow / staleness rules,
                                                                          zero-copy time-major views, or a
                                                                          uniform / prioritized draw)
    trainer.step -> update_priorities(sampling_indices) ----> delivery   (seq-checked priority update)

    ZMQ / shared-memory sample stream -> sample_consumer(stream, g_ing=...) -> ingestion at granularity
        g_ing (one buffer call per g_ing samples, every sample received counted; conduit_srl.consumer)

Each of SRL's four buffer kinds keeps its meaning (``make_buffer`` names and arguments):
``simple_queue`` (FIFO, drop oldest beyond max_size), ``priority_queue`` (SRL's default: serve
each batch ``reuses`` times, freshest first, drop lowest on overflow), ``simple_replay_buffer``
(uniform chunks without replacement), ``prioritized_replay_buffer`` (stratified proportional,
initial priority from the sample's TD error, ``update_priorities``). SRL is imported lazily:
importing this package costs nothing until ``enable`` (or a buffer) is used.
"""

from __future__ import annotations

from .buffers import ConduitQueueBuffer, ConduitReplayBuffer, make_buffer
from .consumer import sample_consumer
from .ingest import IngestCounts, StreamIngest
from .install import disable, enable, enable_consumer, enabled

__all__ = ["ConduitQueueBuffer", "ConduitReplayBuffer", "IngestCounts", "StreamIngest", "disable", "enable",
           "enable_consumer", "enabled", "make_buffer", "sample_consumer"]
