"""The buffer alone: ``bench`` (``conduit bench buffer``: Conduit vs RLlib's buffers, TorchRL's and
a numpy ring, on the ``workload``'s CartPole and Atari transitions; the floors and peers in
``peers``), ``atari_gather`` (a full 200k Atari ring), ``frame_decode`` (float stacks from the frame
pool, on CPU or GPU), ``memory`` and ``replay_rss`` (bytes per tier, RSS per transition),
``calls`` (per-call cost against another checkout, for refactors) and ``gpu_tiers`` (host to device
delivery per placement)."""
