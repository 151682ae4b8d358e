"""Each distribution installs alone from a wheelhouse (``scripts/wheelhouse.sh``), as it would from a
registry: the RLlib adapter's install resolves the core it pins from the wheelhouse and everything else
from the index (a dry run, nothing installed), and the two wheels, unpacked on their own and imported
from outside the checkout, load the core's compiled helpers and serve a tiny RLlib replay workload.

About a minute: the core's wheel compiles its C helpers."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = """
import json, sys
import numpy as np
import conduit_core, conduit_rllib
from conduit_core.selection import sumtree
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
buf = ConduitEpisodeReplayBuffer(capacity=64, prioritized=True, alpha=0.6)   # (RLlib's PrioritizedEpisodeReplayBuffer)
obs = [np.full(4, i, np.float32) for i in range(11)]
buf.add([SingleAgentEpisode(observations=obs, actions=list(range(10)), rewards=[1.0] * 10, terminated=True,
                            len_lookback_buffer=0)])
got = buf.sample(num_items=8, n_step=1)
print(json.dumps({"core": conduit_core.__file__, "adapter": conduit_rllib.__file__, "c_helpers": sumtree.HAVE_C,
                  "sampled": sum(len(e) for e in got), "stored": buf.get_num_timesteps()}))
"""


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    if shutil.which("bash") is None:
        pytest.skip("needs bash for scripts/wheelhouse.sh")
    dest = tmp_path_factory.mktemp("wheelhouse")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "wheelhouse.sh"), str(dest)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dest


def test_the_wheelhouse_holds_every_distribution(wheelhouse):
    names = sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl"))
    assert names == ["conduit_benchmarks", "conduit_edp", "conduit_rllib", "conduit_srl", "conduit_verl"]


def test_an_adapter_installs_alone_with_its_core_from_the_wheelhouse(wheelhouse, tmp_path):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--find-links", str(wheelhouse), "--report", str(report), "conduit-rllib"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    chosen = {i["metadata"]["name"]: i["download_info"]["url"] for i in json.loads(report.read_text())["install"]}
    assert chosen["conduit-rllib"].startswith("file://") and str(wheelhouse) in chosen["conduit-edp"]
    assert "ray" in chosen and "gymnasium" in chosen


def test_the_wheels_alone_import_and_serve_a_replay_workload(wheelhouse, tmp_path):
    pytest.importorskip("ray", reason="the RLlib adapter's workload needs ray[rllib]")
    target = tmp_path / "site"
    wheels = [str(next(wheelhouse.glob(f"{n}-*.whl"))) for n in ("conduit_edp", "conduit_rllib")]
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        *wheels], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(target))   # (ray, numpy, torch from this environment)
    r = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["core"].startswith(str(target)) and got["adapter"].startswith(str(target))   # not the checkout's
    assert got["c_helpers"] is True and got["stored"] == 10 and got["sampled"] == 8   # (RLlib's step accounting: sum(len(e)))
