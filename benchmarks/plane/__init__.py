"""The data plane's own decisions, measured: ``schedule`` (sequential vs overlapped, thread vs
process worker), ``placement`` (the model's per-step cost of each placement), ``migration`` (a buffer
outgrowing its tier mid-run), ``remote_reply`` and ``remote_windows`` (remote shards on a two-node
cluster), ``source_ingest`` (env runners writing where the data is made) and ``tune``
(``conduit tune dqn-synthetic``: predicted vs measured, with ``rank_stability`` re-reading its
reports)."""
