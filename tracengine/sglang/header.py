"""The TraceHeader of a recording of SGLang's scheduler: engine "sglang", its version, the flat
config build.py rebuilds the scheduler from."""
import os


def trace_header(scheduler):
    import platform
    import time

    import torch

    from tracengine.sglang import require_sglang
    from tracengine.sglang.build import header_config
    from tracengine.trace.events import ModelInfo, TraceHeader
    from tracengine.trace.frames import FORMAT_VERSION
    from tracengine.version import __version__
    model_config = scheduler.model_config
    architectures = getattr(model_config.hf_config, "architectures", None) or ["unknown"]
    path = str(scheduler.server_args.model_path)
    name = os.path.basename(path) if os.path.basename(path).startswith("tracengine-sglang-") else path
    return TraceHeader(FORMAT_VERSION, __version__, header_config(scheduler),
                       ModelInfo(name, str(model_config.dtype).removeprefix("torch."), architectures[0]),
                       str(scheduler.server_args.device or platform.machine()), str(torch.__version__),
                       scheduler.server_args.random_seed or 0, time.time(), scheduler.server_args.tp_size,
                       engine="sglang", engine_version=require_sglang("recording SGLang's scheduler"))
