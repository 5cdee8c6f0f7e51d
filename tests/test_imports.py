"""The scheduling and trace side never imports torch."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["tracengine", "tracengine.engine.scheduler", "tracengine.engine.llm_engine",
                                    "tracengine.cli", "tracengine.workload.sources"])
def test_no_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
