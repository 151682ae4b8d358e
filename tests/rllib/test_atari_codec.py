"""Real Atari frames from RLlib's own Atari pipeline through the adapter: the frame-stack and
pixel codecs are picked automatically, store ~1 uint8 frame per step, and deliver exactly the
float32 stacks RLlib produced."""

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="needs ale-py (pip install '.[rllib]')")
pytest.importorskip("cv2", reason="RLlib's Atari wrappers need opencv-python-headless")


def test_qbert_episodes_round_trip_bit_exact_with_frames_stored_once(ray_session):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from conduit_core.schema.framestack import FrameStackCodec
    from conduit_rllib.atari import make_atari_env
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

    env = make_atari_env({"game": "ale_py:ALE/Qbert-v5"})
    rng = np.random.default_rng(0)
    buf = ConduitEpisodeReplayBuffer(capacity=2000, conduit={"reuse_outputs": 0})
    truth = {}
    obs, _ = env.reset(seed=0)
    k = 0
    for chunk in range(12):  # RLlib-style chunks of one ongoing episode
        ep_obs, acts, rews = [obs], [], []
        done = False
        for _ in range(25):
            a = int(rng.integers(env.action_space.n))
            obs, r, term, trunc, _ = env.step(a)
            ep_obs.append(obs)
            acts.append(a)
            rews.append(r)
            if term or trunc:
                done = True
                break
        ep = SingleAgentEpisode(id_=f"ep{k}", observations=ep_obs, actions=acts, rewards=rews,
                                terminated=done, len_lookback_buffer=0).to_numpy()
        for t in range(len(acts)):
            truth[(ep_obs[t].tobytes())] = ep_obs[t + 1]
        buf.add([ep])
        if done:
            obs, _ = env.reset()
            k += 1
    spec = buf.edp.buffer.spec
    assert isinstance(spec["obs"].codec, FrameStackCodec) and spec["obs"].codec.k == 4
    pool = buf.edp.buffer.storage.pools["frames"]
    n = len(buf)
    assert pool.cursor <= n + 4 * 2 * (k + 1) + 8  # ~one new frame per step
    b = buf.sample(256, sample_episodes=True, n_step=1)[0].batch
    assert b["obs"].dtype.is_floating_point and tuple(b["obs"].shape[1:]) == (84, 84, 4)
    for i in range(b.size):
        o = b["obs"][i].numpy()
        assert o.tobytes() in truth, "a delivered observation differs from every stored one"
        np.testing.assert_array_equal(b["next_obs"][i].numpy(), truth[o.tobytes()])
    buf.close()


def test_the_pixel_codec_is_recognised_bit_for_bit():
    """RLlib's q/128 - 1 pixels are recognised; a -0.0 among them (which the codec would give
    back as +0.0) is not, so the buffer stores such observations as they are."""
    from conduit_rllib.columns import pixel_codec
    q = np.random.default_rng(0).integers(0, 256, (2, 84, 84, 4)).astype(np.float32)
    x = q / np.float32(128) - np.float32(1)
    codec = pixel_codec(x)
    assert codec is not None and codec._formula() == "x = q / 128 + -1, q in uint8"
    x[1, 3, 5, 2] = -0.0
    assert pixel_codec(x) is None
