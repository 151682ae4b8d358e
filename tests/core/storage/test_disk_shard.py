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


FULL_DISK_SCRIPT = r"""
import os, subprocess, sys, tempfile
import numpy as np
from conduit_core import CapacityError, ExperienceBuffer, ExperienceSpec, FieldSpec, ShardSpec
import torch
disk = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", disk], check=True)
spec = ExperienceSpec([FieldSpec("obs", (128,), torch.float32)])          # 512 B a row
cap = 4096                                                               # 2 MiB of rows
buf = ExperienceBuffer(spec=spec, capacity=cap, shards=[ShardSpec("disk", cap, path=disk)])
rows = lambda a, n: {"obs": np.repeat(np.arange(a, a + n, dtype=np.float32)[:, None], 128, 1)}
buf.add(rows(0, 100))
with open(os.path.join(disk, "filler"), "wb") as fh:                     # another file takes the rest
    try:
        while True:
            fh.write(b"x" * (256 << 10)); fh.flush()
    except OSError:
        pass
for a in range(100, 3 * cap, 500):                                       # pages never written before
    buf.add(rows(a, 500))
got = buf.read(np.arange(buf.ring.inserted - 10, buf.ring.inserted))["obs"][:, 0]
assert got.tolist() == list(range(buf.ring.inserted - 10, buf.ring.inserted)), got
try:
    ExperienceBuffer(spec=spec, capacity=cap, shards=[ShardSpec("disk", cap, path=disk)])
    print("second shard accepted")
except CapacityError as exc:
    print("refused:", exc)
assert buf.read(np.arange(buf.ring.inserted - 3, buf.ring.inserted))["obs"].shape == (3, 128)
buf.close()
os.unlink(os.path.join(disk, "filler"))
print("left:", os.listdir(disk))
print("ok")
"""


def test_a_disk_that_fills_after_construction_never_kills_the_process():
    """The shard's blocks are reserved when it is made: another file filling the disk later leaves
    every write of the shard its block (a sparse file's write there is a SIGBUS that kills the
    process with every row in memory), and a second shard that no longer fits is a CapacityError
    naming the folder. Run in a mount namespace of its own, on a 6 MiB tmpfs."""
    import shutil
    import subprocess
    import sys
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a small tmpfs in a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    r = subprocess.run(["unshare", "-m", sys.executable, "-c", FULL_DISK_SCRIPT], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (SIGBUS is -7)\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "refused: ShardSpec.path" in r.stdout and "left: []" in r.stdout and "ok" in r.stdout, r.stdout


def test_a_killed_owner_leaves_no_file_behind(tmp_path):
    """The shard's files are unlinked once mapped: a process killed with its buffer open (SIGKILL:
    no close, no atexit) leaves nothing under the shard's path, and its blocks go back to the disk."""
    import signal
    import subprocess
    import sys
    script = ("import numpy as np, sys, time\n"
              "from conduit_core import ExperienceBuffer, ExperienceSpec, ShardSpec\n"
              f"buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,)), capacity=1000,\n"
              f"                       shards=[ShardSpec('disk', 1000, path={str(tmp_path)!r})])\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert os.listdir(tmp_path) == []          # already while it runs
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert os.listdir(tmp_path) == []
