"""Offline RL (BC, MARWIL, CQL) with Conduit's buffer as RLlib's offline pre-learner's
(``prelearner_buffer_class``, set by ``conduit_rllib.enable``): on the same recorded episodes, the batch
RLlib's ``OfflinePreLearner`` hands its learner is RLlib's own, array for array, call after call,
through evictions and episodes sent again; then BC trains on recorded episodes read by Ray Data.

The differential runs RLlib's pre-learner twice in this process, once with RLlib's default
``EpisodeReplayBuffer`` and once with Conduit's, each draw from a generator seeded alike
(``ConduitEpisodeReplayBuffer.share_rng``). RLlib hands the buffer the episodes of a call as a set
(``_validate_episodes``), so their order is the objects' hash order, which differs between two
decodings of the same bytes; the differential orders both by episode id, the one change to RLlib's path
(the other tests hand the buffer RLlib's set)."""

import numpy as np
import pytest
import torch

pytest.importorskip("msgpack_numpy", reason="RLlib reads recorded episodes with msgpack-numpy: "
                    "pip install 'adapters/conduit_rllib[offline]'")

from ray.rllib.offline import offline_prelearner  # noqa: E402
from ray.rllib.offline.offline_prelearner import OfflinePreLearner  # noqa: E402
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer  # noqa: E402

import conduit_rllib  # noqa: E402
from conduit_core import ConfigError  # noqa: E402
from conduit_rllib import workloads  # noqa: E402
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer  # noqa: E402


def record(env_id: str, episodes: int, seed: int) -> list[bytes]:
    return workloads.recorded_episodes(env_id, episodes=episodes, seed=seed)


def offline_config(algo: str, *, capacity: int, lookback: int = 1):
    return workloads.offline_config(algo, env_id="Pendulum-v1" if algo == "CQL" else "CartPole-v1",
                                    capacity=capacity, lookback=lookback)


pre_learner = workloads.pre_learner


@pytest.fixture
def episodes_in_id_order(monkeypatch):
    validate = OfflinePreLearner._validate_episodes
    monkeypatch.setattr(offline_prelearner.OfflinePreLearner, "_validate_episodes",
                        lambda self, eps: sorted(validate(self, eps), key=lambda e: e.id_))


def as_array(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@pytest.mark.parametrize("algo, capacity, lookback, evicts", [("BC", 600, 1, True), ("BC", 5000, 3, False),
                                                              ("MARWIL", 600, 1, True), ("CQL", 500, 1, True)])
def test_the_learner_gets_rllibs_batches_from_the_same_episodes(episodes_in_id_order, algo, capacity, lookback,
                                                                evicts):
    items = record("Pendulum-v1" if algo == "CQL" else "CartPole-v1", 12, seed=0)
    native = pre_learner(offline_config(algo, capacity=capacity, lookback=lookback))
    ours = pre_learner(conduit_rllib.enable(offline_config(algo, capacity=capacity, lookback=lookback)))
    assert type(native.episode_buffer) is EpisodeReplayBuffer
    assert isinstance(ours.episode_buffer, ConduitEpisodeReplayBuffer)
    native.episode_buffer.rng = np.random.default_rng(7)
    ours.episode_buffer.share_rng(np.random.default_rng(7))
    # calls as Ray Data hands them over: overlapping, an episode sent again, evictions past capacity
    for call in (items[:5], items[3:9], items[8:12], items[:2]):
        want = native({"item": np.array(call, dtype=object)})
        got = ours({"item": np.array(call, dtype=object)})
        assert sorted(got) == sorted(want) and len(want) >= 6
        for key in want:
            a, b = as_array(want[key]), as_array(got[key])
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
        assert ours.episode_buffer.get_num_timesteps() == native.episode_buffer.get_num_timesteps()
        assert sorted(ours.episode_buffer.episode_id_to_index) == sorted(native.episode_buffer.episode_id_to_index)
    assert (native.episode_buffer.get_num_episodes_evicted() > 0) is evicts   # the case this parameter set is
    assert ours.episode_buffer.get_num_episodes_evicted() == native.episode_buffer.get_num_episodes_evicted()


def test_an_episode_sent_again_is_not_stored_twice():
    """RLlib's own path, unpatched: the pre-learner hands the buffer a set."""
    items = record("CartPole-v1", 4, seed=1)
    ours = pre_learner(conduit_rllib.enable(offline_config("BC", capacity=10_000)))
    ours({"item": np.array(items, dtype=object)})
    stored = ours.episode_buffer.get_num_timesteps()
    assert len(ours.episode_buffer.episode_id_to_index) == 4
    ours({"item": np.array(items[1:3], dtype=object)})   # RLlib's pre-learner skips ids its buffer holds
    assert ours.episode_buffer.get_num_timesteps() == stored


def test_enable_refuses_an_offline_config_that_would_bypass_the_buffer():
    config = offline_config("BC", capacity=600).offline_data(input_read_episodes=False)
    with pytest.raises(ConfigError, match="input_read_episodes"):
        conduit_rllib.enable(config)
    with pytest.raises(ConfigError, match="delivery"):
        conduit_rllib.enable(offline_config("BC", capacity=600), delivery="columns")
    odd = offline_config("BC", capacity=600).offline_data(prelearner_buffer_kwargs={"alpha": 0.6})
    with pytest.raises(ConfigError, match="alpha"):
        conduit_rllib.enable(odd)
    assert odd.prelearner_buffer_class is None   # a refused enable() changes nothing
    own = offline_config("BC", capacity=600).offline_data(prelearner_buffer_class=EpisodeReplayBuffer)
    with pytest.raises(ConfigError, match="prelearner_buffer_class"):
        conduit_rllib.enable(own)
    with pytest.raises(ConfigError, match="burnin_len"):
        conduit_rllib.enable(offline_config("MARWIL", capacity=600).training(burnin_len=4))


BC_RUN = """
import json, sys
import conduit_rllib
from conduit_core.remote.ray_local import init_local
from conduit_rllib import workloads
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
init_local(num_cpus=3, object_store_memory=256 << 20, log_to_driver=False)
config = conduit_rllib.enable(workloads.offline_config("BC", capacity=2000, input_=[sys.argv[1]])
                              .offline_data(dataset_num_iters_per_learner=2))
algo = config.build_algo()
results = [algo.train()["learners"]["default_policy"] for _ in range(2)]
print(json.dumps({"ours": algo.offline_data.config.prelearner_buffer_class is ConduitEpisodeReplayBuffer,
                  "trained": [int(r["num_module_steps_trained"]) for r in results],
                  "loss": [float(r["policy_loss"]) for r in results]}))
algo.stop()
"""


def test_bc_trains_on_recorded_episodes_read_by_ray_data(tmp_path):
    """The whole route: a parquet of recorded episodes, Ray Data's workers each running RLlib's
    pre-learner over Conduit's buffer (RLlib's set of episodes, unpatched), BC's learner. In a process
    of its own: Ray Data's executor threads outlive ``algo.stop()`` and must not outlive pytest's."""
    import json
    import os
    import subprocess
    import sys

    import pandas as pd
    data = tmp_path / "episodes.parquet"
    pd.DataFrame({"item": record("CartPole-v1", 24, seed=2)}).to_parquet(data)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled")
    proc = subprocess.run([sys.executable, "-c", BC_RUN, str(data)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ours"] and all(n > 0 for n in got["trained"]) and all(np.isfinite(got["loss"])), got


def test_the_bench_times_both_arms_on_the_same_episodes(tmp_path):
    """``conduit bench rllib-bc`` at a tiny size: each arm's pre-learner stored the same steps from the
    same calls, both buffers were timed, and the report's ratios are the medians of the per-round ones."""
    import json
    bench = pytest.importorskip("conduit_benchmarks.rllib.offline", reason="the lab: pip install -e benchmarks")
    out = tmp_path / "r.json"
    report = bench.main(["--episodes", "12", "--per-call", "4", "--batch", "32", "--rounds", "2", "--warmup", "0",
                         "--out", str(out)])
    assert json.loads(out.read_text())["buffer_ratio"] == report["buffer_ratio"]
    for r in report["rounds"]:
        assert r["rllib"]["stored_steps"] == r["conduit"]["stored_steps"] > 0
        assert all(r[arm][k] > 0 for arm in ("rllib", "conduit") for k in ("add_ms", "sample_ms"))
    for key, field in (("buffer_ratio", "buffer_ms"), ("call_ratio", "call_ms")):
        assert report[key] == np.median([r["conduit"][field] / r["rllib"][field] for r in report["rounds"]])
