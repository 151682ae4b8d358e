"""verl's fully-async trainer on CPU with its own MessageQueue and with Conduit's, beside its synchronous
trainer: what each trained on, how stale, and whether the trained lengths are the generated ones.

One command runs, in turn, on the same tiny model, data and seed (integrations/verl_cpu/run.py):

- ``main_ppo``: verl's synchronous trainer (``trainer.use_v1=False``, the base the async recipes share),
  configured as the fully-async one trains: 2 prompts x 2 responses per step, rollout log-probs, one
  optimizer step per batch;
- ``verl``: ``fully_async_main`` with verl's ``MessageQueue``;
- ``conduit``: ``fully_async_main`` with ``conduit_verl.async_queue.ConduitMessageQueue``;

at each staleness asked (``async_training.staleness_threshold``; trigger 1). From the generation trace
(every response the rollout server produced: version, prompt and response digests, length) and the
trained trace (each training step's samples: feed index, versions, lengths) it reports per arm: the
staleness histogram of trained responses (the trainer's version at that step minus the response's
oldest version), whether samples were trained in feed order, trained against generated response lengths, what
was generated and never trained, and verl's per-step loss, grad norm and reward. At staleness 0 it
compares the async arms with ``main_ppo``: the same responses from the same prompts with the same
weight versions, and the same losses. A figure (``--figure``) draws the histograms and the length
distributions.

    python -m benchmarks.verl.fully_async [--steps 4] [--staleness 0 1] [--out out/verl_async.json] \
        [--figure out/verl_async.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from ..common import REPO, fmt_table, machine, write_json

# main_ppo trained as the fully-async trainer trains: its batch is one mini-batch of 2 prompts, and the
# actor takes the rollout's log-probs as the old ones (fully_async_ppo_trainer.yaml: bypass_mode; its
# use_rollout_log_probs is read by nothing in verl 0.9.1)
MAIN_PPO_AS_ASYNC = ["trainer.use_v1=False", "data.train_batch_size=2", "algorithm.rollout_correction.bypass_mode=True"]


def run_arm(arm: str, *, steps: int, staleness: int, seed: int, workdir: Path) -> dict:
    tag = f"{arm}-k{staleness}"
    files = {name: workdir / f"{tag}-{name}.jsonl" for name in ("metrics", "generated", "trained")}
    for f in files.values():
        f.unlink(missing_ok=True)
    cmd = [sys.executable, str(REPO / "integrations" / "verl_cpu" / "run.py"), "--steps", str(steps),
           "--seed", str(seed), "--metrics-out", str(files["metrics"]), "--generation-trace", str(files["generated"]),
           "--log", str(workdir / f"{tag}.log"), "--timeout", "600"]
    if arm == "main_ppo":
        cmd += ["--trainer", "main_ppo", *MAIN_PPO_AS_ASYNC]
    else:
        cmd += ["--trainer", "fully_async", "--queue", arm, "--staleness", str(staleness),
                "--trained-trace", str(files["trained"])]
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=700)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: run.py exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    read = lambda f: [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
    return {"metrics": read(files["metrics"]), "generated": read(files["generated"]),
            "trained": [r["samples"] for r in read(files["trained"])]}


def summarize(arm: str, raw: dict) -> dict:
    """What the arm trained on, from its traces (main_ppo trains every response it generates)."""
    generated_lengths = [g["length"] for g in raw["generated"]]
    curve = [{k: m.get(k) for k in ("step", "actor_loss", "grad_norm", "reward_mean", "response_length_mean")}
             for m in raw["metrics"]]
    if arm == "main_ppo":
        return {"generated_responses": len(generated_lengths), "trained_responses": len(generated_lengths),
                "generated_length_mean": _mean(generated_lengths), "trained_length_mean": _mean(generated_lengths),
                "curve": curve, "staleness": {"0": len(generated_lengths)}, "feed_order": True,
                "trained_lengths": sorted(generated_lengths), "generated_lengths": sorted(generated_lengths)}
    lags, ids, trained_lengths = Counter(), [], []
    for version, samples in enumerate(raw["trained"]):   # trigger 1: a new version every step
        for s in samples:
            ids.append(s["id"])
            lags.update(version - v for v in s["min_version"])   # per response, as main_ppo's
            trained_lengths += s["length"]
    return {"generated_responses": len(generated_lengths), "trained_responses": len(trained_lengths),
            "generated_length_mean": _mean(generated_lengths), "trained_length_mean": _mean(trained_lengths),
            "generated_not_trained": len(generated_lengths) - len(trained_lengths),
            "feed_order": ids == sorted(ids), "trained_ids": ids, "curve": curve,
            "staleness": {str(k): v for k, v in sorted(lags.items())},
            "trained_lengths": sorted(trained_lengths), "generated_lengths": sorted(generated_lengths)}


def same_generation(a: list[dict], b: list[dict], responses: int) -> bool:
    """The first ``responses`` responses of each run (a run generates ahead of what it trains), as
    (weight version, prompt, response) multisets."""
    key = lambda g: (g["version"], g["prompt"], g["response"])
    return Counter(map(key, a[:responses])) == Counter(map(key, b[:responses]))


def compare(arms: dict, raw: dict | None = None) -> dict:
    """Each async arm against main_ppo at staleness 0: the same generation (from the raw traces, where
    given), the same per-step loss, grad norm and reward to the bit, and how far apart where not."""
    sync = arms["main_ppo"]["curve"]
    out = {}
    for arm in ("verl", "conduit"):
        curve = arms[arm]["curve"]
        pairs = list(zip(curve, sync))
        row = {"steps compared": len(pairs),   # verl's fully-async trainer logs no metrics for its last step
               "batches in feed order": arms[arm]["feed_order"],
               "same loss, grad norm, reward per step (bits)": all(
                   (c["actor_loss"], c["grad_norm"], c["reward_mean"]) ==
                   (d["actor_loss"], d["grad_norm"], d["reward_mean"]) for c, d in pairs),
               "largest loss difference": max((abs(c["actor_loss"] - d["actor_loss"]) for c, d in pairs), default=0.0),
               "largest grad norm relative difference": max(
                   (abs(c["grad_norm"] - d["grad_norm"]) / max(abs(d["grad_norm"]), 1e-12) for c, d in pairs),
                   default=0.0)}
        if raw is not None:
            n = arms["main_ppo"]["generated_responses"]
            row["same responses, prompts and versions"] = same_generation(raw[arm]["generated"],
                                                                         raw["main_ppo"]["generated"], n)
        out[f"{arm} vs main_ppo"] = row
    return out


def _mean(xs) -> float | None:
    return round(sum(xs) / len(xs), 3) if xs else None


def figure(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(results)
    fig, axes = plt.subplots(2, len(cases), figsize=(5 * len(cases), 7), squeeze=False)
    for col, case in enumerate(cases):
        arms = results[case]
        ax = axes[0][col]
        width = 0.8 / len(arms)
        for i, (arm, s) in enumerate(arms.items()):
            lags = {int(k): v for k, v in s["staleness"].items()}
            ax.bar([k + (i - (len(arms) - 1) / 2) * width for k in lags], list(lags.values()), width=width, label=arm)
        ax.set_title(f"{case}: staleness of trained responses")
        ax.set_xlabel("trainer version - response's oldest version")
        ax.set_ylabel("responses")
        ax.set_xticks(sorted({int(k) for s in arms.values() for k in s["staleness"]}))
        ax.legend()
        ax = axes[1][col]
        for arm, s in arms.items():
            ax.hist([s["generated_lengths"], s["trained_lengths"]], bins=range(18), histtype="step",
                    label=[f"{arm} generated", f"{arm} trained"])
        ax.set_title(f"{case}: response lengths")
        ax.set_xlabel("tokens")
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verl.fully_async", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/verl_async.json")
    p.add_argument("--figure", default=None)
    a = p.parse_args(argv)
    results, checks = {}, {}
    with tempfile.TemporaryDirectory(prefix="verl_async_") as tmp:
        for k in a.staleness:
            arms = (["main_ppo"] if k == 0 else []) + ["verl", "conduit"]
            raw = {}
            for arm in arms:
                print(f"  staleness {k}: {arm} ...", flush=True)
                raw[arm] = run_arm(arm, steps=a.steps, staleness=k, seed=a.seed, workdir=Path(tmp))
            results[f"staleness {k}"] = {arm: summarize(arm, r) for arm, r in raw.items()}
            if k == 0:
                checks.update(compare(results["staleness 0"], raw))
    rows = [[case, arm, s["feed_order"], json.dumps(s["staleness"]), s["trained_responses"],
             s["generated_responses"], s["trained_length_mean"], s["generated_length_mean"]]
            for case, arms in results.items() for arm, s in arms.items()]
    print(fmt_table([[str(x) for x in r] for r in rows],
                    ["case", "arm", "feed order", "staleness", "trained", "generated", "trained len", "gen len"]))
    for name, c in checks.items():
        print(f"  {name}: {c}")
    write_json(a.out, {"machine": machine(), "args": vars(a), "results": results, "checks": checks})
    if a.figure:
        figure(results, a.figure)
    return {"results": results, "checks": checks}


if __name__ == "__main__":
    main()
