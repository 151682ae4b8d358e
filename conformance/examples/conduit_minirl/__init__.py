"""Conduit adapter for minirl (the example framework in ``conformance/examples/minirl.py``).

This package is also the scaffold: ``conduit new-adapter NAME`` copies it, renamed. The
copy passes the conformance suite out of the box (it still targets minirl); replace the
lines marked ``STAGE MAP`` with your framework's calls and run the suite again.

Stage map (framework stage -> Conduit control point):

    ReplayMemory.push(transitions)   -> ingestion  (columns once, validated against the spec)
    ReplayMemory.sample(B)           -> delivery   (uniform/prioritized selection + gather)
    RolloutStore.push(..., version)  -> ingestion  (tagged with the policy version)
    RolloutStore.drain(version)      -> delivery   (that version only, consumed once)
"""

from .memory import ConduitReplayMemory, ConduitRolloutStore   # STAGE MAP: your adapter's classes

__all__ = ["ConduitReplayMemory", "ConduitRolloutStore"]
