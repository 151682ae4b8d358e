"""The Experience Data Plane: one object over the three control points around a buffer:
ingestion (rollouts in, hooks run, each stored once), delivery (batches prepared, ahead of the
learner when the schedule overlaps) and placement (``migrate``/``replan``), with its metrics."""

from .edp import ExperienceDataPlane
from .hooks import Rollout
from .metrics import ControlPointMetrics, MetricsSnapshot

__all__ = ["ControlPointMetrics", "ExperienceDataPlane", "MetricsSnapshot", "Rollout"]
