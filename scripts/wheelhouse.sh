#!/usr/bin/env bash
# Builds a wheel of the core, of each adapter and of the lab into one folder (a wheelhouse), so that any
# one of them installs alone, with the core it pins found there and everything else from the index:
#
#   bash scripts/wheelhouse.sh [DEST]                   # default DEST: dist/wheelhouse
#   pip install torch==2.13.0                           # first: the CPU wheel (see README)
#   pip install --find-links dist/wheelhouse conduit-rllib        # or conduit-verl, conduit-srl, ...
#
# The core's wheel carries its C helpers compiled for this machine's Python and platform.
#
# The wheels are built from a copy of the checkout's own files (tracked, and new ones not ignored), so
# build outputs left in the checkout (build/, *.egg-info, a module a bed has since moved) never reach a
# wheel, and the build leaves none behind.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=$(mkdir -p "${1:-dist/wheelhouse}" && cd "${1:-dist/wheelhouse}" && pwd)
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null \
    | tar -xf - -C "$SRC"
(cd "$SRC" && python -m pip wheel -q --no-deps --wheel-dir "$DEST" ./ ./adapters/conduit_rllib \
    ./adapters/conduit_verl ./adapters/conduit_srl ./benchmarks)
ls "$DEST"
