"""Planning: the pure decisions. Which tier holds which part of the buffer (placement over a
topology), when and in what sizes the experience path runs (``Schedule``), the cost model that
predicts a step for each choice, the auto-tuner that applies it, and scaling on paper."""

from .costmodel import predict
from .placement import Plan, Workload, plan
from .schedule import Schedule
from .topology import Topology, probe

__all__ = ["Plan", "Schedule", "Topology", "Workload", "plan", "predict", "probe"]
