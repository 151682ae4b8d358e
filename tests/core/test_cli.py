"""The command line answers fast and plainly: ``--help`` and ``info`` start without torch where
they can, an unknown option is refused, and a missing piece names the package that brings it."""

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conduit_core.cli", *args], capture_output=True, text=True,
                          timeout=120)


PROBE = """
import sys, contextlib, io, conduit_core, conduit_core.cli as cli
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        rc = cli.main(sys.argv[1:])
except SystemExit as exc:   # (argparse's --help)
    rc = exc.code
print(rc, conduit_core.__version__, 'torch' in sys.modules)
print(out.getvalue())
"""


def in_a_fresh_interpreter(*args: str) -> tuple[str, str, list[str]]:
    """``conduit ARGS`` run by ``cli.main`` in a new interpreter: (exit code, whether torch was imported
    by then, the lines it printed)."""
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, *printed = r.stdout.splitlines()
    rc, _, torch_loaded = first.split()
    return rc, torch_loaded, printed


def test_help_and_import_do_not_import_torch():
    rc, torch_loaded, _ = in_a_fresh_interpreter("--help")
    assert rc == "0" and torch_loaded == "False"


def test_info_answers_without_torch_and_lists_the_tiers_this_machine_has():
    rc, torch_loaded, printed = in_a_fresh_interpreter("info")
    import torch

    from conduit_core.memory.tiers import Tier, cuda_available
    assert f"{rc} {torch_loaded}" == f"0 {'+cpu' not in torch.__version__}"   # only a CUDA build asks a device
    import conduit_core.cli as cli
    assert cli.TIER_NAMES == tuple(t.value for t in Tier)
    assert set(cli.CUDA_TIERS) == {t.value for t in Tier if t.needs_cuda}
    tiers = next(line for line in printed if line.startswith("tiers available: "))
    assert tiers.split(": ")[1].split(", ") == [t.value for t in Tier if not t.needs_cuda or cuda_available()]
    assert f"torch {torch.__version__}" in printed[0]


def test_help_info_and_an_unknown_workload_answer():
    assert run("--help").returncode == 0
    assert "tiers available" in run("info").stdout
    r = run("bench", "nope")
    assert r.returncode == 2 and "unknown workload" in r.stderr


def test_an_unknown_option_is_refused():
    r = run("info", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_an_unknown_workload_names_where_workloads_come_from():
    r = run("bench", "no-such-workload")
    assert r.returncode == 2 and "pip install -e benchmarks" in r.stderr


def test_the_exports_load_on_first_use_and_are_the_real_objects():
    import conduit_core
    from conduit_core.buffer.experience_buffer import ExperienceBuffer
    assert conduit_core.ExperienceBuffer is ExperienceBuffer
    assert set(conduit_core.__all__) <= set(dir(conduit_core))
    assert all(getattr(conduit_core, name) is not None for name in conduit_core.__all__)
