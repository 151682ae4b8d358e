"""``conduit_rllib.enable``'s options are in its signature (what an IDE and ``help()`` show) and are
exactly ``ConduitOptions``' fields: same names, order, defaults and types, one definition checked
against the other. A misspelt name is refused naming the known ones; the old ``schedule=`` still
means ``mode=``. No Ray session: configs are built, not algorithms."""

import inspect
from dataclasses import fields

import pytest
from ray.rllib.algorithms.dqn import DQNConfig

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import ConduitOptions


def test_the_signature_lists_every_option_as_conduit_options_defines_it():
    params = inspect.signature(conduit_rllib.enable).parameters.values()
    keyword = [(p.name, p.default, p.annotation) for p in params if p.kind is p.KEYWORD_ONLY]
    assert keyword == [(f.name, f.default, f.type) for f in fields(ConduitOptions)]


def test_each_option_reaches_the_config_as_given():
    config = conduit_rllib.enable(DQNConfig().environment("CartPole-v1"), staleness=1, ring_slack=0.5,
                                  source_nodes=["a"])
    got = config.replay_buffer_config["conduit"]
    assert got["staleness"] == 1 and got["ring_slack"] == 0.5 and tuple(got["source_nodes"]) == ("a",)
    assert got["mode"] == "sequential"   # (the default, taken from the signature)


def test_a_misspelt_option_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"enable\(stalenes=\.\.\.\).*staleness"):
        conduit_rllib.enable(DQNConfig().environment("CartPole-v1"), stalenes=1)


def test_the_old_schedule_name_still_sets_the_mode():
    with pytest.warns(DeprecationWarning, match="'schedule' is now 'mode'"):
        config = conduit_rllib.enable(DQNConfig().environment("CartPole-v1"), schedule="overlapped")
    assert config.replay_buffer_config["conduit"]["mode"] == "overlapped"


def test_the_options_given_are_the_options_stored():
    """Each keyword reaches ConduitOptions under its own name (the dict enable() builds is written out)."""
    fields_ = [f.name for f in fields(ConduitOptions)]
    given = {"worker": "process", "staleness": 2, "depth": 3, "obs_codec": None, "reuse_outputs": 1, "seed": 5,
             "delivery_granularity": 2, "ingest_granularity": 4, "autotune_settle": (1, 2),
             "autotune_steps_per_phase": 7, "restore_missing_buffer": True, "ring_slack": 0.5,
             "store_infos": False, "mode": "overlapped"}
    got = conduit_rllib.enable(DQNConfig().environment("CartPole-v1"), **given).replay_buffer_config["conduit"]
    assert set(got) == set(fields_)
    assert {k: (tuple(got[k]) if isinstance(got[k], list) else got[k]) for k in given} == given
