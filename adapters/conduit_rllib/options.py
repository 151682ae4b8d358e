"""The adapter's options: one frozen, validated value (no ``**kwargs`` passthrough)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from conduit_core.errors import ConfigError
from conduit_core.planning.schedule import Schedule
from conduit_core.memory.tiers import Tier


@dataclass(frozen=True)
class ConduitOptions:
    """The schedule's knobs carry ``conduit_core.Schedule``'s names (``mode``, ``worker``,
    ``staleness``, ``depth``, ``ingest_granularity``, ``delivery_granularity``), the same the
    cost model and the tuner use. ``mode``: 'sequential' (inline, RLlib's exact semantics),
    'overlapped' (a background worker ingests and prepares the next batch) or 'auto' (profile
    the first training steps, then the cost model picks overlap and granularity; see
    conduit_core.planning.tuner). ``worker``: 'thread' or 'process' for the overlapped mode. ``staleness``: inserts an off-policy batch
    may miss (0 = RLlib's semantics). ``obs_codec``: 'auto' stores float observations
    that are k/255 as uint8 (verified exactly on every insert), None keeps them as they
    are. ``tier``: where the buffer lives. ``reuse_outputs``: reuse this many delivered
    batch buffers (the learner consumes each batch before the next is drawn).
    ``seed``: the selection RNG's seed (None: the config's seed). ``delivery_granularity``:
    batches prepared per delivery operator call; ``ingest_granularity``: episode chunks per
    ingestion operator call (both are what ``mode='auto'`` tunes; 16 by default, so one
    ``add()`` of DQN's few chunks is one call and one insert). ``autotune_settle``:
    (least, most) learner steps the auto-tuner waits for a steady step time before it
    calibrates; ``autotune_steps_per_phase``: learner steps per calibration phase.
    ``restore_missing_buffer``: restore a checkpoint without a replay buffer file with an
    empty buffer and a warning (default: such a restore fails before anything changes).
    ``ring_slack``: the ring holds ``capacity * (1 + ring_slack)`` slots so that RLlib's
    whole-episode eviction decides what leaves, not the ring (see ``episode_ledger``).
    ``delivery``: what the learner receives: 'columns' (the fast path: the learner's
    tensors directly), 'episodes' (RLlib's own one-step episodes, so RLlib's whole
    learner connector pipeline runs, user pieces included) or None (columns, unless the
    config has learner connector pieces of its own: then episodes). ``store_infos``: keep
    each step's env infos beside its row, as RLlib's buffers keep them (``include_infos``,
    sequence slices and episode delivery hand them out; a checkpoint saves them, so they must
    be plain values: numbers, strings, arrays, lists, dicts with str keys). False stores none,
    and every sample that would carry infos is refused. ``source_ingest``: remote env runners
    write their episode chunks into the buffer's remote shards through writers, and the
    driver commits their receipts (``source_ingest.py``; DQN with ``num_env_runners >= 1``,
    mode 'sequential', delivery_granularity 1). ``source_nodes``: with it, the Ray custom
    resources that pin one remote shard each (the ring split between them); () places one
    remote shard where Ray puts it."""

    mode: str = "sequential"
    worker: str = "thread"
    staleness: int = 0
    depth: int = 2
    obs_codec: str | None = "auto"
    tier: str = "pageable"
    reuse_outputs: int = 2
    seed: int | None = None
    delivery_granularity: int = 1
    ingest_granularity: int = 16
    autotune_settle: tuple[int, int] = (40, 2000)
    autotune_steps_per_phase: int = 40
    restore_missing_buffer: bool = False
    ring_slack: float = 0.25
    delivery: str | None = None
    store_infos: bool = True
    source_ingest: bool = False
    source_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.delivery not in (None, "columns", "episodes"):
            raise ConfigError("delivery", "'columns', 'episodes' or None", repr(self.delivery),
                              "use None to let enable() pick (episodes only where the learner pipeline needs them)")
        settle = self.autotune_settle
        if (not isinstance(settle, (tuple, list)) or len(settle) != 2 or not all(isinstance(x, int) for x in settle)
                or not 0 <= settle[0] <= settle[1]):
            raise ConfigError("autotune_settle", "(least, most) ints with 0 <= least <= most", repr(settle),
                              "e.g. (40, 2000) learner steps; (0, 0) calibrates at once")
        object.__setattr__(self, "autotune_settle", tuple(settle))
        if not isinstance(self.autotune_steps_per_phase, int) or self.autotune_steps_per_phase < 1:
            raise ConfigError("autotune_steps_per_phase", "an int >= 1", repr(self.autotune_steps_per_phase),
                              "use e.g. 40 learner steps per calibration phase")
        if self.obs_codec not in ("auto", None):
            raise ConfigError("obs_codec", "'auto' or None", repr(self.obs_codec),
                              "use 'auto' (lossless uint8 for k/255 pixels) or None")
        if not isinstance(self.reuse_outputs, int) or self.reuse_outputs < 0:
            raise ConfigError("reuse_outputs", "an int >= 0", repr(self.reuse_outputs), "use 2, or 0 for fresh memory")
        if isinstance(self.ring_slack, bool) or not isinstance(self.ring_slack, (int, float)) \
                or not 0 <= self.ring_slack <= 4:
            raise ConfigError("ring_slack", "a number in [0, 4]", repr(self.ring_slack),
                              "use e.g. 0.25 (a ring 25% larger than capacity)")
        self.to_schedule()  # validates mode/worker/staleness/depth
        for name in ("restore_missing_buffer", "store_infos"):   # (a string "false" would be truthy)
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, "True or False", repr(getattr(self, name)),
                                  f"pass {name}=True or {name}=False (a bool, not a string)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError("seed", "None or an int >= 0", repr(self.seed),
                              "pass an int such as 0, or None for the algorithm config's seed")
        Tier.parse(self.tier, argument="tier")   # (a misspelt tier: refused here, not at the first add)
        if not isinstance(self.source_ingest, bool):
            raise ConfigError("source_ingest", "True or False", repr(self.source_ingest),
                              "pass source_ingest=True to have env runners write at the source")
        nodes = self.source_nodes
        if not isinstance(nodes, (tuple, list)) or not all(isinstance(n, str) and n for n in nodes):
            raise ConfigError("source_nodes", "a tuple of Ray custom resource names", repr(nodes),
                              "e.g. ('node_a', 'node_b') (resources the nodes were started with), or ()")
        object.__setattr__(self, "source_nodes", tuple(nodes))
        if self.source_ingest and (self.mode != "sequential" or self.delivery_granularity != 1):
            # commits go straight into the buffer: batches prepared ahead would not see them
            raise ConfigError("source_ingest", "mode='sequential' and delivery_granularity=1",
                              f"mode={self.mode!r}, delivery_granularity={self.delivery_granularity}",
                              "use the sequential schedule with source_ingest=True")

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> "ConduitOptions":
        known = {f.name for f in fields(cls)}
        if "schedule" in options and "mode" not in options:   # the name before the knobs took Schedule's
            import warnings
            warnings.warn("conduit_rllib option 'schedule' is now 'mode' (Schedule's name for it); pass "
                          "mode='sequential'|'overlapped'|'auto'", DeprecationWarning, stacklevel=3)
            options = {("mode" if k == "schedule" else k): v for k, v in options.items()}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"conduit_rllib.enable({unknown[0]}=...)", f"one of {sorted(known)}",
                              repr(unknown[0]), "check the spelling; see conduit_rllib.ConduitOptions")
        return cls(**options)

    def to_schedule(self) -> Schedule:
        g = {"delivery_granularity": self.delivery_granularity, "ingest_granularity": self.ingest_granularity}
        if self.mode in ("sequential", "auto"):  # auto starts sequential, then the tuner decides
            return Schedule.sequential(staleness=self.staleness, depth=self.depth, **g)
        if self.mode == "overlapped":
            return Schedule.overlapped(worker=self.worker, staleness=self.staleness, depth=self.depth, **g)
        raise ConfigError("mode", "'sequential', 'overlapped' or 'auto'", repr(self.mode),
                          "pick a mode; 'auto' profiles the run and lets the cost model choose")

    def to_dict(self) -> dict:
        return asdict(self)
