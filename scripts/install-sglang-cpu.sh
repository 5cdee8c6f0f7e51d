#!/usr/bin/env bash
# Installs the SGLang that tracengine.sglang supports (its scheduler, recorded and replayed) on a
# machine without CUDA, over the CPU torch. SGLang goes in without its dependencies (they pull a
# CUDA torch), then what its scheduler's import needs and the installed packages lack: triton
# (imported at SGLang's module level; importing it needs no GPU) and a few pure-Python packages,
# each without its own dependencies so that nothing installed changes. torchvision is not
# installed: the registry's wheels are CUDA builds that do not load over the CPU torch, and the
# scheduler never calls it (tracengine/sglang/imports.py). Run it after scripts/install-vllm-cpu.sh
# (which brings transformers, pyzmq, orjson, fastapi, ...). On a GPU machine with SGLang, install nothing.
#
#   scripts/install-sglang-cpu.sh            # with the python on PATH
#   PYTHON=.venv/bin/python scripts/install-sglang-cpu.sh
set -euo pipefail
PYTHON="${PYTHON:-python}"
SGLANG_VERSION="0.5.23"        # the version tracengine.sglang is tested with (docs/sglang.md)
pip() { "$PYTHON" -m pip install --quiet "$@"; }

if "$PYTHON" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '$SGLANG_VERSION')" 2>/dev/null; then
    echo "SGLang $SGLANG_VERSION is installed"
    exit 0
fi
pip --no-deps "sglang==$SGLANG_VERSION" triton==3.9.0 setproctitle==1.3.8 sentencepiece==0.2.3 dill==0.4.1 \
    loguru==0.7.3 gguf==0.19.0 compressed-tensors==0.20.1
"$PYTHON" -c "import importlib.metadata as m; print('installed SGLang', m.version('sglang'))"
