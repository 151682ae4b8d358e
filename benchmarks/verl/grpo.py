"""verl GRPO benchmark: Conduit's ingestion + delivery vs verl's sequential path, and Conduit's
put/get vs TransferQueue's, in one run.

Part 1 (exposed path per GRPO iteration, CPU reference): the post-generation stages of one
iteration (balance, verl's NaiveRewardManager, old and reference log-probs of a tiny Qwen2,
apply_kl_penalty, compute_advantage) plus the update hand-off (padded, split per DP rank),
timed as the trainer sees them: verl's sequential order on the whole batch vs Conduit's
chunked, overlapped ingestion and prepared delivery. Alternating repetitions, medians.

Part 2 (put + get for the same batch shapes): TransferQueue's kv_batch_put / kv_batch_get
(installed with verl[verl-core], local Ray) vs Conduit's ingest / deliver of the same fields,
in process and with the buffer's shard in a Ray actor (rows cross processes, as in TransferQueue).

Part 3 (verl's V1 trainer, advantage stage over TransferQueue): verl's whole-batch
``_compute_advantage`` (get 5 fields, KL penalty, GRPO advantage, put 3 fields) vs
``trainer_mode=conduit``'s pipelined chunks of whole prompt groups, on the same rows,
alternating repetitions, medians; the results are checked equal every repetition.

Part 4 (verl's separated trainer, advantage stage on the driver): verl's
``SeparateRayPPOTrainer._fit_compute_advantage`` on the whole batch vs ``ConduitSeparateTrainer``'s
chunks of whole prompt groups, same rows, alternating repetitions, medians; checked equal.

    python -m benchmarks.verl.grpo [--reps 5] [--no-transferqueue] [--skip-grpo]
        [--sep-groups-per-chunk 8 --sep-depth 2 --sep-threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from ..common import fmt_table, machine, ratio_stats, write_json


def part1(reps: int, prompts: int, n: int, resp_len: int, hidden: int, dp: int) -> dict:
    from conduit_verl.delivery import UpdateBatchDelivery
    from conduit_verl.pipeline import GRPOIngestion, GRPOStages, sequential_grpo_path
    from conduit_verl.reference import (
        log_probs,
        make_model,
        make_reward_manager,
        make_tokenizer,
        rollout,
    )
    from conduit_verl.reference import prompts as mk_prompts
    from verl.protocol import pad_dataproto_to_divisor
    from verl.trainer.ppo import core_algos

    tok = make_tokenizer()
    policy, ref = make_model(len(tok), seed=0, hidden=hidden).eval(), make_model(len(tok), seed=1, hidden=hidden).eval()
    rm = make_reward_manager(tok)

    def stages():
        return GRPOStages(reward_fn=lambda d: rm(d),
                          old_log_prob_fn=lambda d: log_probs(policy, d.batch["input_ids"], d.batch["attention_mask"], resp_len),
                          ref_log_prob_fn=lambda d: log_probs(ref, d.batch["input_ids"], d.batch["attention_mask"], resp_len),
                          kl_ctrl=core_algos.FixedKLController(0.001), dp_size=dp)
    rng = np.random.default_rng(0)
    batches = [rollout(policy, tok, mk_prompts(rng, prompts), n=n, resp_len=resp_len, seed=i) for i in range(reps + 1)]
    seq_st, con_st = stages(), stages()
    ingestion = GRPOIngestion(con_st, groups_per_chunk=max(1, prompts // 4), overlap=True)
    delivery = UpdateBatchDelivery(dp_size=dp)
    t_seq, t_con = [], []

    def run_seq(b):
        t0 = time.perf_counter()
        out = sequential_grpo_path(b, seq_st)
        padded, _ = pad_dataproto_to_divisor(out, dp)
        padded.chunk(dp)
        return time.perf_counter() - t0

    def run_con(b, version):
        t0 = time.perf_counter()
        out = ingestion(b)
        delivery.ingest(out, version=version)
        delivery.prepare(version)
        delivery.deliver(version)
        return time.perf_counter() - t0

    run_seq(batches[0].select_idxs(np.arange(len(batches[0]))))  # warm-up both
    run_con(batches[0].select_idxs(np.arange(len(batches[0]))), 0)
    for i in range(1, reps + 1):
        b1 = batches[i].select_idxs(np.arange(len(batches[i])))
        b2 = batches[i].select_idxs(np.arange(len(batches[i])))
        if i % 2:
            t_seq.append(run_seq(b1))
            t_con.append(run_con(b2, i))
        else:
            t_con.append(run_con(b2, i))
            t_seq.append(run_seq(b1))
    ingestion.close()
    delivery.close()
    return {"batch": prompts * n, "resp_len": resp_len, "hidden": hidden, "sequential_s": t_seq, "conduit_s": t_con,
            "ratio": ratio_stats(t_con, t_seq)}


def part2(reps: int, rows: int, seqlen: int, *, tier: str = "pageable") -> dict:
    """Conduit's ingest + deliver of the batch; ``tier="remote"``: the buffer's shard is a Ray
    actor (``conduit_core.remote.remote_shard``), so the rows cross processes as TransferQueue's do."""
    from conduit_core import (
        ExperienceBuffer,
        ExperienceDataPlane,
        ExperienceSpec,
        FieldSpec,
        Fifo,
        ShardSpec,
    )
    fields = {"input_ids": torch.randint(0, 1000, (rows, seqlen)), "attention_mask": torch.ones(rows, seqlen, dtype=torch.int64),
              "old_log_probs": torch.randn(rows, seqlen)}
    spec = ExperienceSpec([FieldSpec(k, tuple(v.shape[1:]), v.dtype) for k, v in fields.items()])
    edp = ExperienceDataPlane(buffer=ExperienceBuffer(spec=spec, capacity=2 * rows, selector=Fifo(),
                                                      shards=[ShardSpec(tier, 2 * rows)]))
    c_put, c_get = [], []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        edp.ingest(fields, policy_version=i)
        t1 = time.perf_counter()
        out = edp.deliver(None, policy_version=i)
        t2 = time.perf_counter()
        assert out.size == rows
        if i:
            c_put.append(t1 - t0)
            c_get.append(t2 - t1)
    edp.close()
    key = "conduit" if tier == "pageable" else f"conduit_{tier}"
    return {"rows": rows, "seqlen": seqlen, f"{key}_put_s": c_put, f"{key}_get_s": c_get}


def part2_tq(reps: int, rows: int, seqlen: int) -> dict:
    import transfer_queue as tq
    from tensordict import TensorDict
    fields = TensorDict({"input_ids": torch.randint(0, 1000, (rows, seqlen)),
                         "attention_mask": torch.ones(rows, seqlen, dtype=torch.int64),
                         "old_log_probs": torch.randn(rows, seqlen)}, batch_size=[rows])
    put, get = [], []
    for i in range(reps + 1):
        keys = [f"it{i}_{j}" for j in range(rows)]
        t0 = time.perf_counter()
        tq.kv_batch_put(keys=keys, partition_id="bench", fields=fields)
        t1 = time.perf_counter()
        out = tq.kv_batch_get(keys=keys, partition_id="bench")
        t2 = time.perf_counter()
        assert out.batch_size[0] == rows
        tq.kv_clear(keys=keys, partition_id="bench")
        if i:
            put.append(t1 - t0)
            get.append(t2 - t1)
    return {"tq_put_s": put, "tq_get_s": get}


def part3_v1_advantage(reps: int, prompts: int, n: int, max_len: int, groups_per_chunk: int, depth: int) -> dict:
    import transfer_queue as tq
    from conduit_verl.v1_trainer import advantage_stage_trainer, grpo_rows, verl_config
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    cfg = verl_config(["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=True", "trainer.v1.trainer_mode=conduit",
                       f"actor_rollout_ref.rollout.n={n}", f"+trainer.v1.conduit.groups_per_chunk={groups_per_chunk}",
                       f"+trainer.v1.conduit.depth={depth}"])
    trainer = advantage_stage_trainer(cfg)
    keys, rows = grpo_rows(prompts, n, max_len, widest_in_every_group=True)  # bit-identical results
    fields = list_of_dict_to_tensordict(rows)
    tags = [{"is_padding": False} for _ in keys]
    stages = {"verl": lambda meta: PPOTrainerSync._compute_advantage(trainer, meta, {}),
              "conduit": lambda meta: trainer._compute_advantage(meta, {})}
    times: dict[str, list[float]] = {"verl": [], "conduit": []}
    written = {}
    for i in range(reps + 1):
        for name in (("verl", "conduit") if i % 2 == 0 else ("conduit", "verl")):
            meta = tq.kv_batch_put(keys=keys, partition_id="v1bench", fields=fields, tags=tags)
            t0 = time.perf_counter()
            stages[name](meta)
            dt = time.perf_counter() - t0
            written[name] = tq.kv_batch_get(keys=keys, partition_id="v1bench", select_fields=["advantages"])
            tq.kv_clear(keys=keys, partition_id="v1bench")
            if i:
                times[name].append(dt)
        same = all(torch.equal(a, b) for a, b in zip(written["verl"]["advantages"].unbind(),
                                                     written["conduit"]["advantages"].unbind()))
        assert same, "trainer_mode=conduit wrote other advantages than verl's stage"
    tokens = sum(int(r["response_mask"].numel()) for r in rows)
    return {"rows": len(keys), "tokens": tokens, "verl_s": times["verl"], "conduit_s": times["conduit"],
            "ratio": ratio_stats(times["conduit"], times["verl"])}


def part4_separated_advantage(reps: int, prompts: int, n: int, resp_len: int, groups_per_chunk: int, depth: int,
                              threads: int) -> dict:
    import copy

    from conduit_verl.separated import advantage_stage_trainer, grpo_batch
    from conduit_verl.v1_trainer import verl_config
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    cfg = verl_config(["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=True", "trainer.use_v1=False",
                       f"actor_rollout_ref.rollout.n={n}", f"+trainer.conduit.groups_per_chunk={groups_per_chunk}",
                       f"+trainer.conduit.depth={depth}"])
    batch, reward = grpo_batch(prompts, n, resp_len)
    trainers = {"verl": advantage_stage_trainer(cfg, SeparateRayPPOTrainer, reward_tensor=reward),
                "conduit": advantage_stage_trainer(cfg, reward_tensor=reward)}
    times: dict[str, list[float]] = {"verl": [], "conduit": []}
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i in range(reps + 1):
            out = {}
            for name in (("verl", "conduit") if i % 2 == 0 else ("conduit", "verl")):
                b = copy.deepcopy(batch)
                t0 = time.perf_counter()
                out[name] = trainers[name]._fit_compute_advantage(b)
                dt = time.perf_counter() - t0
                if i:
                    times[name].append(dt)
            assert torch.equal(out["verl"].batch["advantages"], out["conduit"].batch["advantages"]), \
                "ConduitSeparateTrainer built other advantages than verl's stage"
    finally:
        torch.set_num_threads(prev)
    return {"rows": len(batch), "response_len": resp_len, "groups_per_chunk": groups_per_chunk, "depth": depth,
            "torch_threads": threads, "verl_s": times["verl"], "conduit_s": times["conduit"],
            "ratio": ratio_stats(times["conduit"], times["verl"])}


def with_transferqueue(fn):
    """Run ``fn()`` inside one TransferQueue session on a local Ray (its controller and
    storage actors need CPUs of their own: 2 logical CPUs deadlock)."""
    import ray
    import transfer_queue as tq
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        from conduit_core.remote.ray_local import init_local
        init_local(num_cpus=4, object_store_memory=1 << 30, log_to_driver=False)
    t0 = time.perf_counter()
    tq.init()
    init_s = time.perf_counter() - t0
    try:
        return init_s, fn()
    finally:
        tq.close()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verl.grpo", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--resp-len", type=int, default=24)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--no-transferqueue", action="store_true")
    p.add_argument("--skip-grpo", action="store_true", help="skip part 1 (the CPU reference iteration)")
    p.add_argument("--v1-prompts", type=int, default=64)
    p.add_argument("--v1-n", type=int, default=8)
    p.add_argument("--v1-len", type=int, default=512, help="longest response (lengths uniform in [len/2, len])")
    p.add_argument("--v1-groups-per-chunk", type=int, default=8)
    p.add_argument("--v1-depth", type=int, default=2)
    p.add_argument("--sep-prompts", type=int, default=64)
    p.add_argument("--sep-n", type=int, default=8)
    p.add_argument("--sep-len", type=int, default=1024, help="padded response length (verl's DataProto layout)")
    p.add_argument("--sep-groups-per-chunk", type=int, default=8)
    p.add_argument("--sep-depth", type=int, default=2)
    p.add_argument("--sep-threads", type=int, default=2, help="torch intra-op threads in part 4")
    p.add_argument("--json", default="out/bench_verl.json")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    report = {"machine": machine(), "args": vars(a)}
    med = statistics.median
    if not a.skip_grpo:
        report["grpo"] = g = part1(a.reps, a.prompts, a.n, a.resp_len, a.hidden, a.dp)
        print(f"GRPO iteration, post-generation path + update hand-off ({g['batch']} sequences, median of {a.reps}):")
        print(f"  verl sequential {med(g['sequential_s']) * 1e3:8.1f} ms   conduit {med(g['conduit_s']) * 1e3:8.1f} ms"
              f"   ratio {g['ratio']['median']:.2f}x (min {g['ratio']['min']:.2f}, max {g['ratio']['max']:.2f})")
    report["putget"] = pg = part2(a.reps, a.rows, a.seqlen)
    rows = [["conduit", f"{med(pg['conduit_put_s']) * 1e3:.2f}", f"{med(pg['conduit_get_s']) * 1e3:.2f}",
             f"{(med(pg['conduit_put_s']) + med(pg['conduit_get_s'])) * 1e3:.2f}"]]
    v1 = None
    if not a.no_transferqueue:
        try:
            init_s, (tqr, remote, v1) = with_transferqueue(lambda: (
                part2_tq(a.reps, a.rows, a.seqlen), part2(a.reps, a.rows, a.seqlen, tier="remote"),
                part3_v1_advantage(a.reps, a.v1_prompts, a.v1_n, a.v1_len, a.v1_groups_per_chunk, a.v1_depth)))
            report["putget"] |= tqr | remote | {"tq_init_s": init_s}
            report["v1_advantage"] = v1
            rows.append(["conduit, remote shard (Ray actor)", f"{med(remote['conduit_remote_put_s']) * 1e3:.2f}",
                         f"{med(remote['conduit_remote_get_s']) * 1e3:.2f}",
                         f"{(med(remote['conduit_remote_put_s']) + med(remote['conduit_remote_get_s'])) * 1e3:.2f}"])
            rows.append(["transferqueue", f"{med(tqr['tq_put_s']) * 1e3:.2f}", f"{med(tqr['tq_get_s']) * 1e3:.2f}",
                         f"{(med(tqr['tq_put_s']) + med(tqr['tq_get_s'])) * 1e3:.2f}"])
        except Exception as exc:  # reported, not hidden
            print(f"TransferQueue could not run here: {type(exc).__name__}: {exc}")
            report["putget"]["tq_error"] = repr(exc)
    print(f"\nput + get of {a.rows} x {a.seqlen} (3 fields), medians of {a.reps}:")
    print(fmt_table(rows, ["system", "put ms", "get ms", "put+get ms"]))
    if v1 is not None:
        print(f"\nV1 advantage stage over TransferQueue ({v1['rows']} rows, {v1['tokens']} response tokens, "
              f"median of {a.reps}): verl {med(v1['verl_s']) * 1e3:.1f} ms   conduit {med(v1['conduit_s']) * 1e3:.1f} ms"
              f"   ratio {v1['ratio']['median']:.2f}x (min {v1['ratio']['min']:.2f}, max {v1['ratio']['max']:.2f})")
    report["separated_advantage"] = sep = part4_separated_advantage(
        a.reps, a.sep_prompts, a.sep_n, a.sep_len, a.sep_groups_per_chunk, a.sep_depth, a.sep_threads)
    print(f"\nseparated trainer's advantage stage ({sep['rows']} rows x {sep['response_len']} tokens, "
          f"{a.sep_groups_per_chunk} groups per chunk, depth {a.sep_depth}, {a.sep_threads} torch threads, "
          f"median of {a.reps}): verl {med(sep['verl_s']) * 1e3:.1f} ms   conduit {med(sep['conduit_s']) * 1e3:.1f} ms"
          f"   ratio {sep['ratio']['median']:.2f}x (min {sep['ratio']['min']:.2f}, max {sep['ratio']['max']:.2f})")
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
