"""The conformance suite's own statistics, measured: ``convergence_power`` (how often the
convergence check fails a correct adapter, and how often it catches a known change in learning
speed, replayed on stored native runs)."""
