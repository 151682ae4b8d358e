"""pytest plugin: ``pytest --conduit-adapter=NAME|module:factory --pyargs conduit_conformance.suite``.

Registered through the ``pytest11`` entry point; it imports no framework unless the
option is given."""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("conduit")
    group.addoption("--conduit-adapter", default=None,
                    help="run the Conduit conformance suite on this adapter ('rllib', 'example', module:factory)")
    group.addoption("--conduit-level", default="semantic", choices=["semantic", "convergence"])
    group.addoption("--conduit-xfails", default=None, help="file of 'check/id: reason' lines")
