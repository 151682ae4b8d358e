"""The conformance suite's own statistics, measured: ``false_alarms`` (the semantic level over many
suite seeds on an exact adapter), ``convergence_power`` (how often the
convergence check fails a correct adapter, and how often it catches a known change in learning
speed, replayed on stored native runs)."""
