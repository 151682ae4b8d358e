"""The conformance suite over the verl adapter (every in-repo adapter runs it in CI)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("verl", reason="needs verl[verl-core]")

from conduit_conformance import ConformanceTests  # noqa: E402


class TestVerlConformance(ConformanceTests):
    def make_harness(self):
        from conduit_verl.conformance import harness
        return harness()
