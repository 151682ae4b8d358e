"""A rollout that runs on CPU: rollout name "hf" for verl's server-mode rollout.

Why this exists (verl 0.9.1, paths under verl/): verl generates through rollout *servers* only.
`LLMServerManager` (workers/rollout/llm_server.py:393) asks `RolloutReplicaRegistry`
(workers/rollout/replica.py:312) for the replica class named by `actor_rollout_ref.rollout.name`
("Unknown rollout mode: hf"; only vllm, sglang and trtllm are registered), and the actor worker
builds the matching in-process adapter from `_ROLLOUT_REGISTRY[(name, "async")]` (workers/rollout/base.py:89, workers/engine_workers.py:667).
None of those engines runs here, `HFRollout` (workers/rollout/hf_rollout.py) lacks the abstract
`resume`/`update_weights`/`release` and `rollout.mode=sync` is gone. `register()` adds "hf":

    TaskRunner ─ LLMServerManager ─ HFReplica ─ launches ─> HFServer (Ray actor "hf_server_<r>_0")
    AgentLoopWorker ─ LLMServerClient ─ generate(prompt_ids) ────────^      ^
    actor worker ─ update_weights(mode="naive") ─ HFServerAdapter ─ full weights ┘

`HFServer` samples token by token with a KV cache (transformers `DynamicCache`), returns log-probs,
the weight version (`global_steps`) and stop reason, and treats sleep/wake/KV-cache calls as no-ops
(there is no device memory to free). With `rollout.full_determinism=True` each request's sampler is
seeded from (rollout.seed, weight version, prompt, how many identical prompts came before it): the
n samples of a GRPO group differ, two runs with the same seed draw the same tokens, and so do two
trainers that batch prompts differently (the synchronous trainer sends a batch, the fully-async
rollouter one prompt at a time). verl's request ids cannot tell a group's rows apart everywhere: its
agent loop sends "det-<priority>" (experimental/agent_loop/single_turn_agent_loop.py), the row in the
batch where `AgentLoopManager.generate_sequences` numbers them, but "det-0" for every request of the
fully-async rollouter, which calls the worker directly (fully_async_rollouter.py,
`generate_sequences_single`); vLLM seeds every request with `replica_rank + seed`
(vllm_async_server.py:627), which makes a group's samples identical. Requests run one at a time, in
arrival order, so outputs do not depend on thread interleaving. Which of a group's identical prompts
arrives first is still a race, so two runs may hand the same pair of samples to the group's rows the
other way round (another float sum in the loss); the V1 run sorts rows by content
(ordered_sampler.py), which makes that invisible."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
from collections import Counter
from typing import Any, Optional

import ray
import torch

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"


GENERATION_TRACE_ENV = "VERL_CPU_GENERATION_TRACE"


def _trace_generation(version, prompt_ids: list[int], tokens: list[int], request_id: str = "") -> None:
    """With ``VERL_CPU_GENERATION_TRACE`` naming a file: one JSON line per generated response (the weight
    version, digests of the prompt and of the response, its length), in generation order. Two trainers
    that generate the same responses from the same prompts with the same weights write the same lines."""
    path = os.environ.get(GENERATION_TRACE_ENV)
    if not path:
        return
    import json
    with open(path, "a") as f:
        f.write(json.dumps({"version": version, "prompt": token_digest(prompt_ids), "response": token_digest(tokens),
                            "length": len(tokens), "request": request_id}) + "\n")


def token_digest(ids: list[int]) -> str:
    """A short digest of a token sequence, as the traces name prompts and responses."""
    return hashlib.sha1(str([int(t) for t in ids]).encode()).hexdigest()[:16]


def server_actor_name(replica_rank: int, node_rank: int = 0, suffix: str = "") -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}_{node_rank}{suffix}"


def _model_path(model_config: Any) -> str:
    for key in ("local_path", "path"):
        value = getattr(model_config, key, None) if not isinstance(model_config, dict) else model_config.get(key)
        if value:
            return str(value)
    raise ValueError(f"rollout '{ROLLOUT_NAME}': the model config names no local path ({model_config!r})")


def sample_token(
    logits: torch.Tensor, *, temperature: float, top_k: int, top_p: float, generator: torch.Generator
) -> int:
    """One token from a [vocab] logit row: greedy at temperature 0, else top-k, top-p, then sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scores = logits / temperature
    if top_k is not None and 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


class HFServer:
    """Token-in, token-out generation with a HF causal LM on CPU; the method names verl's replicas call."""

    def __init__(self, *, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.replica_rank = replica_rank
        path = _model_path(model_config)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.global_steps: Optional[int] = None
        self._seen: Counter = Counter()
        self._lock = asyncio.Lock()

    # --- generation -------------------------------------------------------------------------------
    def _request_seed(self, prompt_ids: list[int]) -> int:
        if not self.config.full_determinism:
            return int.from_bytes(os.urandom(8), "little") >> 1
        key = (self.global_steps, tuple(prompt_ids))
        occurrence = self._seen[key]
        self._seen[key] += 1
        text = f"{self.config.seed}:{self.replica_rank}:{self.global_steps}:{occurrence}:{prompt_ids}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1

    def _max_tokens(self, prompt_len: int, sampling_params: dict) -> int:
        room = self.config.max_model_len - prompt_len if self.config.max_model_len else None
        if "max_tokens" in sampling_params:
            wanted = sampling_params["max_tokens"]
        elif "max_new_tokens" in sampling_params:
            wanted = sampling_params["max_new_tokens"]
        else:
            wanted = min(
                self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len
            )
        return max(1, min(wanted, room) if room is not None else wanted)

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], sampling_params: dict, seed: int):
        from transformers import DynamicCache

        generator = torch.Generator().manual_seed(seed)
        max_tokens = self._max_tokens(len(prompt_ids), sampling_params)
        ignore_eos = sampling_params.get("ignore_eos", self.config.ignore_eos)
        want_logprobs = bool(sampling_params.get("logprobs"))
        cache = DynamicCache()
        inputs = torch.tensor([prompt_ids], dtype=torch.long)
        tokens, log_probs = [], []
        for _ in range(max_tokens):
            out = self.model(input_ids=inputs, past_key_values=cache, use_cache=True)
            logits = out.logits[0, -1].float()
            token = sample_token(
                logits,
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_k=int(sampling_params.get("top_k", -1)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                generator=generator,
            )
            tokens.append(token)
            if want_logprobs:
                log_probs.append(float(torch.log_softmax(logits, dim=-1)[token]))
            if token in self.eos_ids and not ignore_eos:
                break
            inputs = torch.tensor([[token]], dtype=torch.long)
        return tokens, (log_probs if want_logprobs else None)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
    ):
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data:
            raise NotImplementedError(f"rollout '{ROLLOUT_NAME}' is text-only")
        prompt_ids = [int(t) for t in prompt_ids]
        async with self._lock:  # one request at a time, in arrival order
            seed = self._request_seed(prompt_ids)
            tokens, log_probs = await asyncio.to_thread(self._generate, prompt_ids, dict(sampling_params), seed)
            steps = self.global_steps
            _trace_generation(steps, prompt_ids, tokens, str(request_id))
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": steps},
        )

    # --- weights ----------------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor]) -> int:
        async with self._lock:
            own = self.model.state_dict()
            unknown = sorted(set(state) - set(own))
            if unknown:
                raise KeyError(f"rollout '{ROLLOUT_NAME}': weights the model does not have: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in state.items():
                    own[name].copy_(tensor.to(own[name].dtype))
            return len(state)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps
        self._seen.clear()

    # --- lifecycle calls verl makes on every replica: nothing to free on CPU ------------------------
    async def ready(self) -> bool:
        return True

    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        async with self._lock:
            return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


@functools.cache
def _replica_class():
    from verl.workers.rollout.replica import RolloutReplica

    class HFReplica(RolloutReplica):
        """One `HFServer` per replica (rollout world size 1), in any mode (hybrid, colocated, standalone)."""

        async def launch_servers(self) -> None:
            name = server_actor_name(self.replica_rank, 0, self.name_suffix)
            server = (
                ray.remote(HFServer)
                .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            )
            await server.ready.remote()
            self.servers = [server]
            self._server_handle = server
            self._server_address = name

    return HFReplica


@functools.cache
def _adapter_class():
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.utils import ensure_async_iterator

    class HFServerAdapter(BaseRollout):
        """In the actor worker: hands the trained weights (full tensors) to the replica's `HFServer`."""

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
            super().__init__(config, model_config, device_mesh)
            rollout_world_size = (
                self.config.tensor_model_parallel_size
                * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size
            )
            rank = int(os.environ.get("RANK", 0))
            self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
            self._has_server = rank % rollout_world_size == 0
            self._server = None

        def _server_handle(self):
            if self._server is None:
                self._server = ray.get_actor(server_actor_name(self.replica_rank))
            return self._server

        async def resume(self, tags: list[str]):
            return None

        async def release(self):
            return None

        @torch.no_grad()
        async def update_weights(self, weights, global_steps: int = None, wire_format: str = "named_tensors", **kw):
            if wire_format != "named_tensors":
                raise NotImplementedError(f"rollout '{ROLLOUT_NAME}' takes full tensors, got wire_format={wire_format}")
            state = {}
            async for name, tensor in ensure_async_iterator(weights):  # every rank: may hold collectives
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                state[name] = tensor.detach().to("cpu", copy=True)
            if self._has_server:
                server = self._server_handle()
                await server.update_weights.remote(state)
                if global_steps is not None:
                    await server.set_global_steps.remote(global_steps)

    return HFServerAdapter


def register() -> None:
    """Make `actor_rollout_ref.rollout.name=hf` resolvable in this process. Idempotent."""
    from verl.workers.rollout import base, replica

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"
    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica_class)


def __getattr__(name: str):
    # `get_rollout_class` imports the adapter by dotted name; build the verl subclasses lazily so that
    # importing this module (done by every process through plugin.py) stays cheap.
    if name == "HFServerAdapter":
        return _adapter_class()
    if name == "HFReplica":
        return _replica_class()
    raise AttributeError(name)
