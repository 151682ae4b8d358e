"""The checks every delivery call makes on its arguments, before anything is drawn: pure
functions of the arguments (and the spec), each error naming the argument, what was expected,
what came, and the fix."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..errors import CapacityError, ConfigError, SpecError
from ..memory.budget import available_bytes, fmt
from ..memory.tiers import Tier
from .episodes import EPISODE_END_RULES

PLAIN_FIELDS, PLAIN_N_STEP = (type(None), tuple), (type(None), int, tuple)   # what replay_args leaves as it is


def replay_args(fields, n_step) -> tuple:
    """``(fields, n_step)`` in the one form every delivery route passes on: fields as a tuple
    (a str is left for ``check_fields`` to name), n_step as None, an int or a ``(lo, hi)`` tuple
    (a list or array of two becomes one). Checks nothing: ``check_fields``/``check_sampling`` do."""
    if fields is not None and type(fields) is not tuple and not isinstance(fields, str):
        try:
            fields = tuple(fields)   # (a generator is read once, here)
        except TypeError:
            pass   # not a sequence: check_fields names it
    if isinstance(n_step, list) or (isinstance(n_step, np.ndarray) and n_step.ndim == 1):
        n_step = tuple(int(v) if isinstance(v, np.integer) else v for v in n_step)
    return fields, n_step


def check_device(device) -> None:
    """A delivery's ``device``: None (host memory) or a device this machine has, named before
    anything is drawn (torch's own error would come from inside the gather)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError("device", "None (host memory) or a torch device such as 'cpu' or 'cuda:0'", repr(device),
                          "pass device=None or a device name torch knows") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ConfigError("device", "a device this machine has", f"{device!r} (torch sees "
                          f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA devices)",
                          "pass device=None (host memory), or run where that GPU is")


def check_batch_size(batch_size, row_bytes: int) -> None:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ConfigError("batch_size", "a positive int", repr(batch_size), "pass e.g. batch_size=32")
    out = int(batch_size) * row_bytes
    if out < (256 << 20):  # the usual case costs no system call on the hot path
        return
    free = available_bytes(Tier.PAGEABLE)
    if free is not None and out > free:
        raise CapacityError(f"batch_size: a batch of {batch_size} rows needs {fmt(out)}, {fmt(free)} of host "
                            "memory is free. Fix: sample smaller batches.")


def check_sampling(n_step, gamma: float, beta: float | None) -> None:
    """n-step, discount and importance exponent."""
    if (n_step is None or (type(n_step) is int and n_step >= 1)
            or (type(n_step) is tuple and len(n_step) == 2 and type(n_step[0]) is int and type(n_step[1]) is int
                and 1 <= n_step[0] <= n_step[1])) \
            and type(gamma) is float and 0.0 <= gamma <= 1.0 \
            and (beta is None or (type(beta) is float and 0.0 <= beta < math.inf)):
        return  # the usual call, decided without a function call
    ok = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
    if n_step is not None:
        if isinstance(n_step, (tuple, list)):
            if len(n_step) != 2 or not all(ok(v) for v in n_step) or not 1 <= n_step[0] <= n_step[1]:
                raise ConfigError("n_step", "an int >= 1 or (lo, hi) ints with 1 <= lo <= hi (drawn from "
                                  "[lo, hi))", repr(n_step), "e.g. n_step=3 or n_step=(2, 5)")
        elif not ok(n_step) or n_step < 1:
            raise ConfigError("n_step", "an int >= 1 or (lo, hi)", repr(n_step), "e.g. n_step=3 or (2, 5)")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma <= 1.0:
        raise ConfigError("gamma", "a discount in [0, 1]", repr(gamma), "e.g. gamma=0.99")
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float, np.floating))
                             or not np.isfinite(beta) or beta < 0):
        raise ConfigError("beta", "a finite number >= 0 (or None: the selector's)", repr(beta), "e.g. beta=0.4")


def check_fields(spec, fields) -> None:
    if fields is None:
        return
    if isinstance(fields, str):
        raise ConfigError("fields", "a sequence of field names", repr(fields), f"pass [{fields!r}]")
    try:
        unknown = [f for f in fields if f not in spec]
    except TypeError:
        raise ConfigError("fields", "a sequence of field names", type(fields).__name__,
                          "pass e.g. fields=['obs', 'action'], or None for all") from None
    if unknown:
        raise SpecError(f"fields[{unknown[0]!r}]", f"one of the spec's fields {list(spec.names)}",
                        "not in the spec", "ask for declared fields only")


def check_episode_end(episode_end: str) -> None:
    """The rule for windows that would run past their episode's stored end."""
    if episode_end not in EPISODE_END_RULES:
        raise ConfigError("episode_end", f"one of {EPISODE_END_RULES}", repr(episode_end),
                          "'redraw' for RLlib's prioritized buffer, 'shorten' for its uniform one")


def check_redraw_selector(selector) -> None:
    """The redraw rule runs in the native walk: plain uniform or unstratified prioritized draws."""
    if getattr(selector, "stratified", False):
        raise ConfigError("episode_end", "'shorten' with Prioritized(stratified=True)", "'redraw'",
                          "the redraw walk draws items independently (RLlib's rule): use "
                          "Prioritized(stratified=False) for it")
    if not selector.native_windows:
        raise ConfigError("episode_end", f"'shorten' with the {selector.name} selector", "'redraw'",
                          "the redraw rule runs in the native walk, which draws plain uniform or "
                          "prioritized items: use episode_end='shorten' with this selector")


def check_length(length, capacity: int) -> None:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 1 <= length <= capacity:
        raise ConfigError("length", f"an int in [1, capacity={capacity}]", repr(length), "use e.g. length=20")


class SamplingChecks:
    """One buffer's ``sample()`` argument checks, remembered for the argument tuples that
    passed: a training loop asks for the same batch every step, and five checks per call
    become one set lookup. Only exactly-typed arguments (int batch size, float gamma and
    beta, None/int/(int, int) n_step, a tuple of field names) are remembered, so a value
    that merely compares equal to an accepted one (``True`` for 1, ``1`` for 1.0) is still
    checked, and refused, every time; a batch whose size needs the free-memory probe is never
    remembered (the answer can change). The spec and selector are the buffer's, fixed."""

    LIMIT = 64   # distinct argument tuples kept (then forgotten all at once)

    def __init__(self):
        self._passed: set = set()

    def check(self, buf, batch_size, n_step, gamma, beta, episode_end, fields) -> None:
        key = None
        if type(batch_size) is int and type(gamma) is float and (beta is None or type(beta) is float) \
                and type(episode_end) is str and (fields is None or type(fields) is tuple) \
                and (n_step is None or type(n_step) is int
                     or (type(n_step) is tuple and len(n_step) == 2 and type(n_step[0]) is int
                         and type(n_step[1]) is int)):
            key = (batch_size, n_step, gamma, beta, episode_end, fields)
            try:
                if key in self._passed:   # (only keys of str field names are ever added, below)
                    return
            except TypeError:   # an unhashable field name: the checks below name it
                key = None
        check_episode_end(episode_end)
        check_sampling(n_step, gamma, beta)
        check_batch_size(batch_size, buf.row_bytes)
        check_fields(buf.spec, fields)
        if n_step is not None and episode_end == "redraw":
            check_redraw_selector(buf.selector)
        if key is not None and batch_size * buf.row_bytes < (256 << 20) \
                and (fields is None or all(type(f) is str for f in fields)):
            if len(self._passed) >= self.LIMIT:
                self._passed.clear()
            self._passed.add(key)
