"""Differential: on the same adds, ConduitReplayBuffer (sb3_stream) delivers what SB3's own
ReplayBuffer delivers, tensor for tensor (value, dtype, shape), over n_envs, the time-limit rule,
the observation and action spaces SB3 stores, wrap-around and VecNormalize; and SB3's DQN and SAC
train to the same weights through either."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer

from conduit_core import ConfigError, SpecError
from conduit_sb3 import ConduitDictReplayBuffer, ConduitReplayBuffer

BOX = spaces.Box(-10, 10, (3,), np.float32)
DISCRETE_OBS = spaces.Discrete(7)
IMAGE = spaces.Box(0, 255, (4, 5, 2), np.uint8)
ACTIONS = {"discrete": spaces.Discrete(3), "box64": spaces.Box(-1, 1, (2,), np.float64),
           "multidiscrete": spaces.MultiDiscrete([3, 4])}


def _step(rng, obs_space, action_space, n_envs):
    def one(space):
        draws = [space.sample() for _ in range(n_envs)]
        if isinstance(space, spaces.Dict):
            return {k: np.stack([d[k] for d in draws]) for k in space.spaces}
        return np.stack(draws)
    done = rng.random(n_envs) < 0.2
    infos = [{"TimeLimit.truncated": bool(t)} if d else {} for d, t in zip(done, rng.random(n_envs) < 0.5)]
    return one(obs_space), one(obs_space), one(action_space), rng.normal(size=n_envs), done, infos


def _same(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k}]")
        return
    if a is None:
        assert b is None, where
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
    assert th.equal(a, b), where


def _run_pair(native, conduit, obs_space, action_space, n_envs, adds, batch, seed, env=None):
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    action_space.seed(seed)
    samples = 0
    for t in range(adds):
        o, no, a, r, d, infos = _step(rng, obs_space, action_space, n_envs)
        for b in (native, conduit):
            b.add(o.copy() if not isinstance(o, dict) else dict(o), no, a, r, d, infos)
        if t % 4 == 3:
            np.random.seed(seed + t)
            s1 = native.sample(batch, env=env)
            np.random.seed(seed + t)
            s2 = conduit.sample(batch, env=env)
            for f in s1._fields:
                _same(getattr(s1, f), getattr(s2, f), f"step {t} field {f}")
            samples += 1
    assert samples > 0


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("timeouts", [True, False])
@pytest.mark.parametrize("obs_space", [BOX, DISCRETE_OBS, IMAGE], ids=["box", "discrete", "image"])
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_samples_equal_sb3s(n_envs, timeouts, obs_space, action):
    act = ACTIONS[action]
    kw = dict(device="cpu", n_envs=n_envs, handle_timeout_termination=timeouts)
    native = ReplayBuffer(24, obs_space, act, **kw)
    conduit = ConduitReplayBuffer(24, obs_space, act, sb3_stream=True, **kw)
    try:
        _run_pair(native, conduit, obs_space, act, n_envs, adds=41, batch=16, seed=5)   # wraps past 24 // n_envs
        assert (conduit.pos, conduit.full) == (native.pos, native.full)
    finally:
        conduit.close()


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 40), n_envs=st.integers(1, 4), adds=st.integers(1, 60), batch=st.integers(1, 33),
       seed=st.integers(0, 2**16))
def test_samples_equal_sb3s_property(capacity, n_envs, adds, batch, seed):
    native = ReplayBuffer(capacity, BOX, ACTIONS["discrete"], device="cpu", n_envs=n_envs)
    conduit = ConduitReplayBuffer(capacity, BOX, ACTIONS["discrete"], device="cpu", n_envs=n_envs, sb3_stream=True)
    try:
        _run_pair(native, conduit, BOX, ACTIONS["discrete"], n_envs, adds=max(adds, 4), batch=batch, seed=seed)
    finally:
        conduit.close()


def test_dict_observations_equal_sb3s():
    space = spaces.Dict({"goal": spaces.Box(-1, 1, (2,), np.float32), "pixels": IMAGE, "step": DISCRETE_OBS})
    native = DictReplayBuffer(20, space, ACTIONS["discrete"], device="cpu", n_envs=2)
    conduit = ConduitDictReplayBuffer(20, space, ACTIONS["discrete"], device="cpu", n_envs=2, sb3_stream=True)
    try:
        _run_pair(native, conduit, space, ACTIONS["discrete"], 2, adds=27, batch=8, seed=2)
        # next_obs keys look one step ahead: declared so, not guessed from the name
        assert all(conduit.edp.buffer.spec[f"next_obs.{k}"].window_step == "last" for k in space.spaces)
    finally:
        conduit.close()


class _Normalizer:
    """VecNormalize's two calls, on numpy, as SB3's _normalize_obs/_normalize_reward make them."""

    def normalize_obs(self, obs):
        return (obs - 0.5) / 2.0

    def normalize_reward(self, reward):
        return (reward * 0.1).astype(np.float32)


def test_vecnormalize_applied_as_sb3_applies_it():
    native = ReplayBuffer(16, BOX, ACTIONS["discrete"], device="cpu")
    conduit = ConduitReplayBuffer(16, BOX, ACTIONS["discrete"], device="cpu", sb3_stream=True)
    try:
        _run_pair(native, conduit, BOX, ACTIONS["discrete"], 1, adds=20, batch=8, seed=4, env=_Normalizer())
    finally:
        conduit.close()


def test_own_stream_leaves_numpys_global_stream_alone():
    """Without sb3_stream the draw is Conduit's own: numpy's global stream (SB3's exploration) moves
    only by the one seed drawn at construction, never per sample, reset or load."""
    conduit = ConduitReplayBuffer(16, BOX, ACTIONS["discrete"], device="cpu")
    try:
        rng = np.random.default_rng(0)
        for _ in range(10):
            conduit.add(*_step(rng, BOX, ACTIONS["discrete"], 1))
        np.random.seed(1)
        before = np.random.get_state()
        conduit.sample(32)
        restored = pickle.loads(pickle.dumps(conduit))
        conduit.reset()
        after = np.random.get_state()
        assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]
        restored.close()
    finally:
        conduit.close()


def test_save_and_load_as_sb3_does(tmp_path):
    """SB3's save_replay_buffer pickles the buffer: the rows and the draw come back."""
    conduit = ConduitReplayBuffer(12, BOX, ACTIONS["discrete"], device="cpu", sb3_stream=True)
    rng = np.random.default_rng(3)
    for _ in range(17):
        conduit.add(*_step(rng, BOX, ACTIONS["discrete"], 1))
    path = tmp_path / "buffer.pkl"
    path.write_bytes(pickle.dumps(conduit))
    loaded = pickle.loads(path.read_bytes())
    try:
        assert (loaded.pos, loaded.full) == (conduit.pos, conduit.full)
        np.random.seed(9)
        a = conduit.sample(10)
        np.random.seed(9)
        b = loaded.sample(10)
        for f in a._fields:
            _same(getattr(a, f), getattr(b, f), f)
    finally:
        conduit.close()
        loaded.close()


def test_refusals_name_the_field_and_the_fix():
    with pytest.raises(ConfigError, match="optimize_memory_usage"):
        ConduitReplayBuffer(8, BOX, ACTIONS["discrete"], optimize_memory_usage=True, handle_timeout_termination=False)
    with pytest.raises(ConfigError, match="n_steps.*NStepReplayBuffer"):
        ConduitReplayBuffer(8, BOX, ACTIONS["discrete"], n_steps=3, gamma=0.9)
    with pytest.raises(ConfigError, match="ConduitDictReplayBuffer"):
        ConduitReplayBuffer(8, spaces.Dict({"a": BOX}), ACTIONS["discrete"])
    buf = ConduitReplayBuffer(8, BOX, ACTIONS["discrete"], device="cpu")
    try:
        with pytest.raises(ConfigError, match="learning_starts"):
            buf.sample(4)
        with pytest.raises(SpecError, match="obs"):
            buf.add(np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32), np.array([0]), np.array([1.0]),
                    np.array([False]), [{}])
        with pytest.raises(SpecError, match="reward.*finite"):
            buf.add(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), np.array([0]), np.array([np.nan]),
                    np.array([False]), [{}])
        buf.flush()
        assert buf.size() == 0 and len(buf.edp.buffer) == 0   # the refused adds stored nothing, staged nothing
    finally:
        buf.close()


def test_sb3_stream_refuses_a_schedule_that_draws_ahead():
    """A batch drawn ahead would take numpy's global stream out of SB3's order, on another thread."""
    from conduit_core import Schedule
    for schedule in (Schedule.overlapped(staleness=1), Schedule.sequential(delivery_granularity=2)):
        with pytest.raises(ConfigError, match="schedule.*sb3_stream"):
            ConduitReplayBuffer(8, BOX, ACTIONS["discrete"], sb3_stream=True, schedule=schedule)


def test_a_block_that_cannot_be_stored_takes_its_steps_back():
    """A staged block whose ingestion fails (here: the data plane closed under it) leaves SB3's count
    where the stored rows are, and the error reaches the caller."""
    from conduit_core import ClosedError
    buf = ConduitReplayBuffer(200, BOX, ACTIONS["discrete"], device="cpu")
    rng = np.random.default_rng(0)
    for _ in range(70):   # one block of 64 stored, 6 staged
        buf.add(*_step(rng, BOX, ACTIONS["discrete"], 1))
    buf.edp.close()
    with pytest.raises(ClosedError):
        buf.flush()
    assert (buf.pos, buf.full) == (64, False) and buf.size() == 64
    buf.close()   # idempotent on a closed plane


def test_a_real_vecnormalize_is_applied_as_sb3_applies_it():
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    env = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    env.seed(0)
    env.reset()
    for _ in range(50):   # running statistics that are not the identity
        env.step(np.array([env.action_space.sample()]))
    space = env.observation_space
    native = ReplayBuffer(16, space, env.action_space, device="cpu")
    conduit = ConduitReplayBuffer(16, space, env.action_space, device="cpu", sb3_stream=True)
    try:
        _run_pair(native, conduit, space, env.action_space, 1, adds=20, batch=8, seed=4, env=env)
    finally:
        conduit.close()
        env.close()


def _trained_weights(algo, env_id, buffer_class, steps, **kw):
    from stable_baselines3 import DQN, SAC
    cls = {"dqn": DQN, "sac": SAC}[algo]
    extra = {} if buffer_class is None else {"replay_buffer_class": buffer_class,
                                             "replay_buffer_kwargs": {"sb3_stream": True}}
    model = cls("MlpPolicy", env_id, seed=3, device="cpu", **kw, **extra)
    model.learn(steps)
    if buffer_class is not None:
        model.replay_buffer.close()
    return [p.detach().clone() for p in model.policy.parameters()]


@pytest.mark.parametrize("algo,env_id,steps,kw", [
    ("dqn", "CartPole-v1", 2500, dict(learning_starts=500, train_freq=64, gradient_steps=16,
                                      policy_kwargs=dict(net_arch=[32, 32]))),
    ("sac", "Pendulum-v1", 500, dict(learning_starts=200, batch_size=32, policy_kwargs=dict(net_arch=[32, 32]))),
])
def test_training_is_bit_identical_with_sb3s_stream(algo, env_id, steps, kw):
    threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        native = _trained_weights(algo, env_id, None, steps, **kw)
        conduit = _trained_weights(algo, env_id, ConduitReplayBuffer, steps, **kw)
    finally:
        th.set_num_threads(threads)
    assert len(native) == len(conduit)
    assert all(th.equal(a, b) for a, b in zip(native, conduit))


@pytest.mark.parametrize("sb3_stream", [False, True])
def test_a_collected_buffer_releases_its_data_plane(sb3_stream):
    """SB3 never closes a replay buffer: an overlapped schedule's worker thread must not outlive it,
    nor may the data plane keep the buffer alive (the shared-stream draw holds it weakly)."""
    import gc
    import threading

    from conduit_core import Schedule
    before = set(threading.enumerate())
    schedule = Schedule.sequential() if sb3_stream else Schedule.overlapped(staleness=1)
    buf = ConduitReplayBuffer(16, BOX, ACTIONS["discrete"], device="cpu", schedule=schedule, sb3_stream=sb3_stream)
    rng = np.random.default_rng(0)
    for _ in range(5):
        buf.add(*_step(rng, BOX, ACTIONS["discrete"], 1))
    buf.sample(4)
    edp = buf.edp
    del buf
    gc.collect()
    assert edp.closed
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_reset_empties_and_a_dict_buffer_saves_and_loads():
    """SB3's reset() empties the buffer (the next sample refuses); a dict buffer with two envs
    pickled mid-block (steps staged) comes back with every row and SB3's count."""
    space = spaces.Dict({"goal": spaces.Box(-1, 1, (2,), np.float32), "step": DISCRETE_OBS})
    buf = ConduitDictReplayBuffer(30, space, ACTIONS["discrete"], device="cpu", n_envs=2)
    rng = np.random.default_rng(1)
    space.seed(1)
    for _ in range(9):
        buf.add(*_step(rng, space, ACTIONS["discrete"], 2))
    loaded = pickle.loads(pickle.dumps(buf))
    try:
        assert (loaded.pos, loaded.full, len(loaded.edp.buffer)) == (buf.pos, buf.full, 18)
        for field in ("obs.goal", "next_obs.step", "action", "reward", "terminated", "truncated"):
            assert th.equal(buf.edp.read(np.arange(18))[field], loaded.edp.read(np.arange(18))[field]), field
        buf.reset()
        assert buf.size() == 0 and len(buf.edp.buffer) == 0
        with pytest.raises(ConfigError, match="empty buffer"):
            buf.sample(4)
    finally:
        buf.close()
        loaded.close()


def test_the_data_planes_metrics_reach_sb3s_logger(tmp_path):
    import csv

    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure

    from conduit_sb3 import ConduitMetricsCallback
    model = DQN("MlpPolicy", "CartPole-v1", seed=0, device="cpu", learning_starts=100, train_freq=16,
                policy_kwargs=dict(net_arch=[16]), replay_buffer_class=ConduitReplayBuffer)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(600, callback=ConduitMetricsCallback(), log_interval=1)
    model.replay_buffer.close()
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert rows and {"conduit/buffer_size", "conduit/inserted", "conduit/deliver_blocked_ms"} <= set(rows[0])
    last = [r for r in rows if r["conduit/inserted"]][-1]
    assert 0 < float(last["conduit/inserted"]) <= 600 and float(last["conduit/deliver_calls"]) > 0
