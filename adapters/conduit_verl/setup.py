"""The version and the pin on the core, from the project's one version file (``conduit_core/VERSION``
in the checkout), so that no version is written by hand here: this distribution is built at the
core's version and requires the core at exactly it. Built from an sdist (no checkout around it),
the version is the one the sdist recorded in its PKG-INFO."""

from email.parser import Parser
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# verl with its core extra; tested: 0.9.1 (README, compatibility)
REQUIRES = [
    "verl[verl-core]>=0.9.1,<0.10",
    "omegaconf",
]


def project_version() -> str:
    for checkout in HERE.parents[:2]:   # the lab sits one folder down the checkout, an adapter two
        source = checkout / "conduit_core" / "VERSION"
        if source.is_file():
            return source.read_text(encoding="utf-8").strip()
    return Parser().parsestr((HERE / "PKG-INFO").read_text(encoding="utf-8"))["Version"]


class BuildPyWithoutThisScript(build_py):
    """The package is this very folder (package-dir "."): keep this build script out of the wheel."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if Path(m[2]).resolve() != Path(__file__).resolve()]


VERSION = project_version()
setup(version=VERSION, install_requires=[f"conduit-edp=={VERSION}", *REQUIRES],
      cmdclass={"build_py": BuildPyWithoutThisScript})
