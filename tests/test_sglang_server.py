"""SGLang's own runtime on the CPU (sglang.Engine: its tokenizer manager, and its scheduler in a
process it spawns, loading plugins as it starts), a one-layer Llama config with dummy weights and
its real forward (torch_native attention): tracengine's plugin records the scheduler through
TRACENGINE_RECORD, and the trace replays exactly. SGLang's spawned processes import torchvision
(not installable over the CPU torch here), so a sitecustomize puts tracengine's placeholder in each
(docs/sglang.md). Skipped where SGLang is not installed."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.trace.events import RequestAdded, SeqFinish

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
REPO = Path(__file__).resolve().parents[1]
SITECUSTOMIZE = "from tracengine.sglang.imports import torchvision_placeholders\ntorchvision_placeholders()\n"
ENGINE = """
if __name__ == "__main__":
    import sglang
    engine = sglang.Engine(model_path=MODEL, device="cpu", load_format="dummy", skip_tokenizer_init=True,
                           dtype="float32", max_total_tokens=2000, disable_overlap_schedule=True,
                           attention_backend="torch_native", log_level="error", random_seed=0)
    params = {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}
    engine.generate(input_ids=[[1, 2, 3, 4, 5] * 8, [1, 2, 3, 4, 5] * 8 + [9, 9]], sampling_params=params)
    engine.generate(input_ids=[1, 2, 3, 4, 5] * 8 + [7], sampling_params=params)      # a radix-cache hit
    engine.shutdown()
"""


def test_sglangs_engine_on_the_cpu_records_through_the_plugin_and_replays(tmp_path):
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.tracelog import open_trace
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 32000, "max_position_embeddings": 512, "torch_dtype": "float32"}))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    script = tmp_path / "engine.py"
    script.write_text(f"MODEL = {str(model)!r}\n" + ENGINE)
    path = tmp_path / "engine.trace"
    env = {**os.environ, "TRACENGINE_RECORD": str(path), "SGLANG_PLUGINS": "tracengine",
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    events = list(open_trace(path))
    assert events[0].engine == "sglang" and events[0].device == "cpu"
    assert sum(type(e) is RequestAdded for e in events) == 3 and sum(type(e) is SeqFinish for e in events) == 3
    assert reexecute(events).ok
