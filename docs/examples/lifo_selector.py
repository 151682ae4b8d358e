"""A consuming selector of your own: LIFO, the newest queued row first, each delivered once.

A selector with ``consumes = True`` is driven by ``ExperienceBuffer.take()``: it is asked for
positions among the rows still queued (oldest = 0), and the rows it picks leave the buffer. The
buffer never overwrites a queued row, so a full queue makes inserts wait (or raise), whatever the
order rows are taken in.

Run it: ``python docs/examples/lifo_selector.py``.
"""

import numpy as np

from conduit_core import ExperienceBuffer, ExperienceSpec, Selector


class Lifo(Selector):
    name, consumes = "lifo", True

    def select(self, batch_size, size, rng):
        return np.arange(size - 1, size - 1 - batch_size, -1), None   # newest first; no weights


def main() -> list[float]:
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(1,)), capacity=16, selector=Lifo())
    for r in range(6):
        buf.add({"obs": np.full((1, 1), r, np.float32), "action": np.zeros(1, np.int64),
                 "reward": np.full(1, r, np.float32), "next_obs": np.full((1, 1), r + 1, np.float32),
                 "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)})
    first = buf.take(2)["reward"].tolist()     # [5.0, 4.0]: the newest two
    rest = buf.take()["reward"].tolist()       # [3.0, 2.0, 1.0, 0.0]: what was left, newest first
    buf.close()
    return first + rest


if __name__ == "__main__":
    print(main())
