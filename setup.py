"""Builds the C helpers (conduit_core._native._sumtree: priority trees and n-step walks; conduit_core._native._frames:
frame stacks out of a frame pool; conduit_core._native._segments: variable-length rows gathered;
conduit_core._native._affine: the affine codec's encode in one pass; conduit_core._native._draws: uniform draws;
conduit_core._native._scan: finite-value checks; conduit_core._native._pages: a mapping's pages committed ahead of its writer;
conduit_core._native._rows: a plain host ring's rows in (the insert) and out (the gather)); everything else is in pyproject.toml.

If no C compiler is available the build still succeeds and Conduit falls back to numpy
(slower, same results).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # pragma: no cover - depends on the machine
            print(f"conduit: C helper not built ({exc}); using the numpy fallback")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # pragma: no cover
            print(f"conduit: C helper {ext.name} not built ({exc}); using the numpy fallback")


NATIVE_H = ["conduit_core/_native/_native.h"]  # shared by every helper: a change rebuilds them all


def numpy_headers() -> list[str] | None:
    """numpy's C headers (a build requirement in pyproject.toml): _rows reads arrays through
    numpy's C API. Without them _rows is not built and inserts take the Python route."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - a build without numpy
        return None
    return [numpy.get_include()]


NUMPY_H = numpy_headers()

setup(
    ext_modules=[Extension("conduit_core._native._sumtree", ["conduit_core/_native/_sumtree.c"], depends=NATIVE_H, extra_compile_args=["-O3"]),
                 Extension("conduit_core._native._frames", ["conduit_core/_native/_frames.c"], depends=NATIVE_H,
                           # no fused multiply-add: the vectorised decode's two roundings are what was checked
                           extra_compile_args=["-O3", "-ffp-contract=off"]),
                 Extension("conduit_core._native._segments", ["conduit_core/_native/_segments.c"], depends=NATIVE_H, extra_compile_args=["-O3"]),
                 Extension("conduit_core._native._scan", ["conduit_core/_native/_scan.c"], depends=NATIVE_H, extra_compile_args=["-O3"]),
                 Extension("conduit_core._native._draws", ["conduit_core/_native/_draws.c"], depends=NATIVE_H, extra_compile_args=["-O3"]),
                 Extension("conduit_core._native._pages", ["conduit_core/_native/_pages.c"], extra_compile_args=["-O2"]),
                 Extension("conduit_core._native._affine", ["conduit_core/_native/_affine.c"], depends=NATIVE_H, extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math"])]
                + ([Extension("conduit_core._native._rows", ["conduit_core/_native/_rows.c"], include_dirs=NUMPY_H, extra_compile_args=["-O3"])]
                   if NUMPY_H else []),
    cmdclass={"build_ext": OptionalBuildExt},
)
