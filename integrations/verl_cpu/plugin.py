"""The module `VERL_USE_EXTERNAL_MODULES` names: imported by `import verl` in every process of a run.

verl/__init__.py:49-52 imports the comma-separated modules in `VERL_USE_EXTERNAL_MODULES` right after
its own core imports, in the driver, the TaskRunner, every worker, the agent-loop and reward workers
and the rollout server (Ray workers inherit the driver's environment). That is the one place where a
CPU platform can be selected before anything asks `get_platform()` (trainer/constants_ppo.py calls it
at import time) and where a rollout name can be registered in the processes that look it up.
"""

from integrations.verl_cpu import cpu_platform, get_trace, hf_rollout, object_store_engine, trained_trace

cpu_platform.install()
hf_rollout.register()
object_store_engine.register()   # weights to standalone rollout replicas (one-step-off, fully-async)
get_trace.install()  # only with VERL_CPU_GET_TRACE set: digests of every TransferQueue get
trained_trace.install()  # only with VERL_CPU_TRAINED_TRACE set: what each fully-async training step took
