#!/usr/bin/env bash
# Builds TorchRL as the buffer bench's peer (benchmarks/buffer/peers.py) into a directory of its own,
# outside the project's environment, for this machine's torch:
#   bash benchmarks/buffer/torchrl_peer.sh RL_SRC [DEST]       # DEST default: out/torchrl
#   PYTHONPATH=$PWD/out/torchrl OMP_NUM_THREADS=1 conduit bench buffer
# RL_SRC: a copy of TorchRL's source (github.com/pytorch/rl, MIT), for its C++ extension only.
# Why a build: torchrl 0.14.1's wheel carries an extension built against another torch; under
# torch 2.13 it fails to load ("undefined symbol: _ZN5torch8autograd13_wrap_outputs..."), and the
# prioritized sampler's sum tree lives in it. So: the wheel's Python files (no dependencies pulled,
# so the project's torch stays), tensordict 0.14.x and the two small packages TorchRL 0.14 imports,
# then the extension compiled from RL_SRC's torchrl/csrc against the installed torch (CPU, ~2 min).
# The wheel ships top-level `benchmarks` and `sota-*` folders; they are removed so that they do not
# shadow this project's `benchmarks` package.
set -euo pipefail
SRC=${1:?usage: bash benchmarks/buffer/torchrl_peer.sh RL_SRC [DEST]}
DEST=$(realpath -m "${2:-out/torchrl}")
PY=$(command -v "${PY:-python}"); [[ $PY = /* ]] || PY=$PWD/$PY   # absolute, venv link kept
[ -f "$SRC/torchrl/csrc/pybind.cpp" ] || { echo "$SRC has no torchrl/csrc/pybind.cpp: pass a copy of pytorch/rl" >&2; exit 2; }
$PY -m pip install -q --no-deps --target "$DEST" "torchrl==0.14.1" "tensordict>=0.14.3,<0.15" pyvers hoptorch
rm -rf "$DEST/benchmarks" "$DEST"/sota-* "$DEST/bin"
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
cp -r "$SRC/torchrl/csrc" "$BUILD/csrc"
cat > "$BUILD/setup.py" <<'EOF'
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name="torchrl_ext", cmdclass={"build_ext": BuildExtension},
      ext_modules=[CppExtension("_torchrl", ["csrc/pybind.cpp", "csrc/utils.cpp"],
                                extra_compile_args=["-O3", "-std=c++17"])])
EOF
(cd "$BUILD" && $PY setup.py -q build_ext --inplace >build.log 2>&1) || { tail -20 "$BUILD/build.log"; exit 1; }
cp "$BUILD"/_torchrl*.so "$DEST/torchrl/"
PYTHONPATH="$DEST" $PY -c "from benchmarks.buffer.peers import torchrl_available as a; ok, v = a(); print('torchrl', v); raise SystemExit(0 if ok else 1)"
echo "built: PYTHONPATH=$DEST"
