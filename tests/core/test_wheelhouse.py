"""Each distribution installs alone from a wheelhouse (``scripts/wheelhouse.sh``), as it would from a
registry: each adapter's install resolves the core it pins from the wheelhouse and everything else from the
index (a dry run, nothing installed), and each adapter's wheel with the core's, unpacked on their own and
imported from outside the checkout, serves a tiny workload of its framework: RLlib's replay buffer API;
verl's plugin entry point registering Conduit's TransferQueue backend, and GRPO's ingestion stages equal to
verl's sequential path; SRL's buffer kinds without SRL and, where SRL's venv is built
(``CONDUIT_SRL_PYTHON``), a queue served to SRL's own samples.

A few minutes: the core's wheel compiles its C helpers, and each dry run resolves an adapter's tree."""

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


VERL_WORKLOAD = """
import importlib.metadata, json, os
import numpy as np, torch
import conduit_core, conduit_verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from conduit_verl.pipeline import GRPOIngestion, GRPOStages, sequential_grpo_path
# verl loads its plugins on import; the entry point is read from the unpacked wheel's own metadata (this
# environment's editable install declares the same one)
(dist,) = [d for d in importlib.metadata.distributions(path=[os.environ["PYTHONPATH"]]) if d.name == "conduit-verl"]
(plugin,) = [e.value for e in dist.entry_points if e.group == "verl.plugins" and e.name == "conduit"]
import transfer_queue
from transfer_queue.storage.managers.base import StorageManagerFactory
import sys
backend = sys.modules["conduit_verl.tq_backend"]

def batch(seed, prompts=4, n=3, plen=3, rlen=6):
    g = torch.Generator().manual_seed(seed)
    b = prompts * n
    am = torch.ones(b, plen + rlen, dtype=torch.long)
    for i, length in enumerate(torch.randint(2, rlen + 1, (b,), generator=g).tolist()):
        am[i, plen + length:] = 0
    p, r = torch.randint(0, 50, (b, plen), generator=g), torch.randint(0, 50, (b, rlen), generator=g)
    return DataProto.from_dict(tensors={"prompts": p, "responses": r, "input_ids": torch.cat([p, r], 1),
                                        "attention_mask": am},
                               non_tensors={"uid": np.array([f"q{i // n}" for i in range(b)], dtype=object)})

def stages():
    def reward(d):
        out = torch.zeros(d.batch["responses"].shape)
        last = d.batch["response_mask"].sum(-1).long() - 1
        out[torch.arange(out.shape[0]), last] = (d.batch["responses"][:, 0] % 3 == 0).float()
        return out
    def log_prob(scale):
        return lambda d: -(d.batch["responses"].float() % 7) * scale
    return GRPOStages(reward_fn=reward, old_log_prob_fn=log_prob(0.1), ref_log_prob_fn=log_prob(0.11),
                      kl_ctrl=core_algos.FixedKLController(0.05), dp_size=2)

with GRPOIngestion(stages(), groups_per_chunk=2) as ingest:
    got, want = ingest(batch(0)), sequential_grpo_path(batch(0), stages())
same = all(torch.equal(got.batch[k], want.batch[k]) for k in ("advantages", "returns", "token_level_rewards"))
print(json.dumps({"core": conduit_core.__file__, "adapter": conduit_verl.__file__, "plugin": plugin,
                  "backend": backend.__file__, "registered": "Conduit" in StorageManagerFactory._registry,
                  "same_as_verl": same, "rows": len(got)}))
"""

SRL_WORKLOAD_WITHOUT_SRL = """
import importlib.metadata, json, os
import conduit_core, conduit_srl
(dist,) = [d for d in importlib.metadata.distributions(path=[os.environ["PYTHONPATH"]]) if d.name == "conduit-srl"]
(harness,) = [e.value for e in dist.entry_points if e.group == "conduit.harnesses" and e.name == "srl"]
built = sorted(type(conduit_srl.make_buffer(kind, batch_size=2, **more)).__name__ for kind, more in (
    ("simple_queue", {}), ("priority_queue", {}), ("simple_replay_buffer", {"max_size": 8, "warmup_transitions": 4})))
try:
    conduit_srl.enable()
    refused = None
except conduit_core.ConfigError as e:
    refused = str(e)
print(json.dumps({"core": conduit_core.__file__, "adapter": conduit_srl.__file__, "harness": harness,
                  "built": built, "refused": refused}))
"""

SRL_WORKLOAD = """
import json
import numpy as np
import conduit_core, conduit_srl
from rlsrl.api.trainer import SampleBatch
conduit_srl.enable()
from rlsrl.base import buffer as srl_buffer
buf = srl_buffer.make_buffer("simple_queue", batch_size=2, max_size=8)   # SRL's own call, Conduit's buffer
for i in range(4):
    buf.put(SampleBatch(obs=np.full((5, 3), i, np.float32), reward=np.full((5, 1), float(i), np.float32),
                        policy_version_steps=np.zeros((5, 1), np.int64)))
served = [buf.get().sample.reward[0, :, 0].tolist() for _ in range(2)]
print(json.dumps({"core": conduit_core.__file__, "adapter": conduit_srl.__file__,
                  "kind": type(buf).__name__, "served": served, "empty": buf.empty()}))
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


@pytest.mark.parametrize("adapter, framework", [("conduit-rllib", "ray"), ("conduit-verl", "verl"),
                                                ("conduit-srl", "pyzmq")])
def test_an_adapter_installs_alone_with_its_core_from_the_wheelhouse(wheelhouse, tmp_path, adapter, framework):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--find-links", str(wheelhouse), "--report", str(report), adapter],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    chosen = {i["metadata"]["name"]: i["download_info"]["url"] for i in json.loads(report.read_text())["install"]}
    assert chosen[adapter].startswith("file://") and str(wheelhouse) in chosen["conduit-edp"]
    assert framework in chosen and not {"conduit-rllib", "conduit-verl", "conduit-srl"} - {adapter} & set(chosen)


def unpack_alone(wheelhouse: Path, target: Path, *names: str) -> None:
    """The core's wheel and ``names``' unpacked into ``target``, nothing else (their dependencies come
    from this environment)."""
    wheels = [str(next(wheelhouse.glob(f"{n}-*.whl"))) for n in ("conduit_edp", *names)]
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        *wheels], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def run_from(target: Path, code: str, cwd: Path, python: str = sys.executable) -> dict:
    """``code`` run by ``python`` with the unpacked wheels first on its path; its last printed line."""
    env = dict(os.environ, PYTHONPATH=str(target), HF_HUB_OFFLINE="1")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["core"].startswith(str(target)) and got["adapter"].startswith(str(target))   # not the checkout's
    return got


def test_the_rllib_wheels_alone_import_and_serve_a_replay_workload(wheelhouse, tmp_path):
    pytest.importorskip("ray", reason="the RLlib adapter's workload needs ray[rllib]")
    unpack_alone(wheelhouse, tmp_path / "site", "conduit_rllib")
    got = run_from(tmp_path / "site", WORKLOAD, tmp_path)
    assert got["c_helpers"] is True and got["stored"] == 10 and got["sampled"] == 8   # (RLlib's step accounting: sum(len(e)))


def test_the_verl_wheels_alone_register_with_verl_and_run_grpo_ingestion(wheelhouse, tmp_path):
    pytest.importorskip("verl", reason="the verl adapter's workload needs verl[verl-core]")
    unpack_alone(wheelhouse, tmp_path / "site", "conduit_verl")
    got = run_from(tmp_path / "site", VERL_WORKLOAD, tmp_path)
    assert got["plugin"] == "conduit_verl.plugin" and got["backend"].startswith(str(tmp_path / "site"))
    assert got["registered"] is True and got["same_as_verl"] is True and got["rows"] == 12


def test_the_srl_wheels_alone_build_srls_buffer_kinds(wheelhouse, tmp_path):
    """Without SRL (this environment): the buffers build, the suite finds the harness, and ``enable``
    refuses saying how to get SRL; with SRL's venv, SRL's own ``make_buffer`` serves SRL's samples."""
    unpack_alone(wheelhouse, tmp_path / "site", "conduit_srl")
    got = run_from(tmp_path / "site", SRL_WORKLOAD_WITHOUT_SRL, tmp_path)
    assert got["harness"] == "conduit_srl.conformance:harness"
    assert got["built"] == ["ConduitQueueBuffer", "ConduitQueueBuffer", "ConduitReplayBuffer"]
    assert "setup-srl-venv.sh" in got["refused"]


@pytest.mark.skipif(not os.environ.get("CONDUIT_SRL_PYTHON"), reason="CONDUIT_SRL_PYTHON is not set: SRL's "
                    "venv (scripts/srl/setup-srl-venv.sh SRC VENV, or .ci/run with SRL_SRC=SRC) runs this")
def test_the_srl_wheels_alone_serve_srls_samples_in_srls_venv(wheelhouse, tmp_path):
    unpack_alone(wheelhouse, tmp_path / "site", "conduit_srl")
    got = run_from(tmp_path / "site", SRL_WORKLOAD, tmp_path, python=os.environ["CONDUIT_SRL_PYTHON"])
    assert got["kind"] == "ConduitQueueBuffer" and got["served"] == [[0.0, 1.0], [2.0, 3.0]] and got["empty"]
