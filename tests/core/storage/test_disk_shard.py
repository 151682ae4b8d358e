"""A new storage tier is one module (issue 14): ``conduit_core/storage/disk_shard.py`` registers the
disk kind, and every delivery path, a mixed layout, a migration and a state round trip
serve it unchanged, delivering exactly what a host-memory buffer delivers."""

import os

import numpy as np
import pytest
import torch

from conduit_core import (CapacityError, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec,
                          FieldSpec, Prioritized, Shard, ShardSpec, register_shard_kind)
from conduit_core.storage.disk_shard import DiskShard
from conduit_core.storage.shards import shard_kinds


def spec():
    return ExperienceSpec([FieldSpec("obs", (3,), torch.float32), FieldSpec("action", (), torch.int64),
                           FieldSpec("reward", (), torch.float32), FieldSpec("next_obs", (3,), torch.float32),
                           FieldSpec("terminated", (), torch.bool), FieldSpec("truncated", (), torch.bool),
                           FieldSpec("logits", (2,), torch.bfloat16)])


def rollout(first: int, n: int, *, end: bool) -> dict:
    ids = np.arange(first, first + n, dtype=np.float32)
    term = np.zeros(n, bool)
    term[-1] = end
    return {"obs": np.stack([ids] * 3, 1), "action": ids.astype(np.int64) % 4, "reward": ids / 10,
            "next_obs": np.stack([ids + 1] * 3, 1), "terminated": term, "truncated": np.zeros(n, bool),
            "logits": torch.stack([torch.from_numpy(ids), -torch.from_numpy(ids)], 1).to(torch.bfloat16)}


def fill(buf: ExperienceBuffer) -> None:
    for i, n in enumerate([7, 11, 5, 9, 13]):
        buf.add(rollout(100 * i, n, end=i % 2 == 0), source=i % 2)


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("selector", [None, "prioritized"])
def test_a_disk_shard_delivers_what_host_memory_delivers(tmp_path, selector):
    make = lambda shards: ExperienceBuffer(spec=spec(), capacity=32, shards=shards, seed=3,
                                           selector=Prioritized() if selector else None)
    host = make([ShardSpec("pageable", 32)])
    disk = make([ShardSpec("disk", 32, path=str(tmp_path))])
    mixed = make([ShardSpec("pageable", 12), ShardSpec("disk", 20, path=str(tmp_path))])
    assert disk.storage.parts[0].kind == "disk" and disk.storage.shards[0].tier.value == "pageable"
    for buf in (host, disk, mixed):
        fill(buf)                                  # 45 rows into 32 slots: the ring wraps over both shards
    for _ in range(3):
        want = host.sample(8)
        same(dict(disk.sample(8)), dict(want))
        same(dict(mixed.sample(8)), dict(want))
        want = host.sample(6, n_step=3, gamma=0.9)
        same(dict(disk.sample(6, n_step=3, gamma=0.9)), dict(want))
        same(dict(mixed.sample(6, n_step=3, gamma=0.9)), dict(want))
        want = host.sample_sequences(4, 5)
        same(dict(disk.sample_sequences(4, 5)), dict(want))
        same(dict(mixed.sample_sequences(4, 5)), dict(want))
    same(disk.read(np.arange(20, 30)), host.read(np.arange(20, 30)))
    again = make([ShardSpec("disk", 32, path=str(tmp_path))])
    again.load_state_dict(mixed.state_dict())   # state saved from a mixed layout, loaded into a disk one
    same(dict(again.sample(8)), dict(host.sample(8)))
    for buf in (host, disk, mixed, again):
        buf.close()
    assert os.listdir(tmp_path) == []              # every file went with its shard


def test_a_data_plane_migrates_its_rows_onto_disk_while_serving(tmp_path):
    with ExperienceDataPlane(buffer=ExperienceBuffer(spec=spec(), capacity=64, seed=1)) as edp:
        edp.ingest(rollout(0, 40, end=True))
        moving = edp.migrate(shards=[ShardSpec("disk", 64, path=str(tmp_path))], capacity=64)
        edp.ingest(rollout(40, 10, end=True))      # while the copy runs: the new layout gets it too
        moving.wait()
        assert [p.kind for p in edp.buffer.storage.parts] == ["disk"]
        got = edp.read(np.arange(50))
        assert got["obs"][:, 0].tolist() == list(range(50))
        assert got["logits"][:, 1].tolist() == [-float(torch.tensor(i, dtype=torch.bfloat16)) for i in range(50)]
    assert os.listdir(tmp_path) == []


def test_disk_shard_errors_name_the_field_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="ShardSpec.path"):
        ExperienceBuffer(spec=spec(), capacity=8, shards=[ShardSpec("disk", 8, path=str(tmp_path / "missing"))])
    with pytest.raises(CapacityError, match="disk shard"):
        DiskShard.memory_needed(ShardSpec("disk", 10**15, path=str(tmp_path)), 64)
    with pytest.raises(ConfigError, match="'pageable' for a disk shard"):
        ExperienceBuffer(spec=spec(), capacity=8, shards=[ShardSpec("shared", 8, kind="disk")])
    with pytest.raises(ConfigError, match="registered shard kind"):
        ShardSpec("tape", 8)
    with pytest.raises(ConfigError, match="ShardSpec.kind"):
        ShardSpec("pageable", 8, kind="tape")


def test_a_kind_may_not_shadow_a_tier_and_needs_a_name():
    class Unnamed(Shard):
        pass

    class Pinned(Shard):
        kind = "pinned"

    for cls in (Unnamed, Pinned):
        with pytest.raises(ConfigError):
            register_shard_kind(cls)
    assert {"local", "mapped", "remote", "disk"} <= set(shard_kinds())
