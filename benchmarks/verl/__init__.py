"""verl against Conduit: ``grpo`` (the post-generation path and the update hand-off, and the
advantage stages of the V1 and separated trainers), ``tq_backends`` (TransferQueue put and get:
SimpleStorage vs Conduit's backend), ``trainer_e2e`` (verl's GRPO trainer on CPU per stage) and
``fully_async`` (``conduit bench verl-async``: the fully-async trainer with verl's queue and
Conduit's, beside the synchronous one)."""
