"""The C helpers behind the hot paths (built by setup.py; each module that uses one keeps a numpy
route for a machine without a C compiler, with the same results): ``_rows`` (a host ring's rows in
and out), ``_sumtree`` (priority trees and n-step walks), ``_draws`` (uniform draws), ``_frames``
(frame stacks), ``_affine`` (the affine codec), ``_scan`` (finite-value checks), ``_segments``
(variable-length rows) and ``_pages`` (a mapping's pages committed ahead of its writer)."""
