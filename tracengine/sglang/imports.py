"""SGLang's scheduler module, imported once. SGLang imports torchvision at module level in two
multimodal config modules (InternVL's image transforms, DeepSeek-OCR's) that the scheduler's
import reaches and never calls. torchvision's wheels on the package registry are CUDA builds
that do not load over the CPU torch; where torchvision is not importable, a placeholder stands
in for it while SGLang's modules are imported, and is taken out again after, so that nothing
else in the process (transformers, vLLM) sees a torchvision: transformers is asked first whether
one is installed (its answer is cached), and it is not."""
import functools
import importlib.util
import sys
import types
import warnings

_TORCHVISION_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class _Unavailable(type):
    """A torchvision name SGLang's modules import: any attribute of it is itself; using it raises."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        raise RuntimeError("torchvision is not installed here (SGLang's multimodal inputs need it)")


class _Placeholder(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(name, (), {})


def torchvision_placeholders() -> dict:
    """Where torchvision is not importable, the placeholder modules, put in sys.modules (and
    returned, for taking out); {} where it is. SGLang's own processes (its server's, spawned)
    need them for their whole life: a sitecustomize there calls this (docs/sglang.md)."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return {}
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()      # cached as False before the placeholder is in
    placeholders = {name: _Placeholder(name) for name in _TORCHVISION_MODULES}
    for name, module in placeholders.items():
        module.__path__ = []
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(placeholders[parent], child, module)
    sys.modules.update(placeholders)
    return placeholders


@functools.cache
def scheduler_module():
    """sglang.srt.managers.scheduler, imported (its import takes seconds: SGLang's whole runtime)."""
    placeholders = torchvision_placeholders()
    try:
        with warnings.catch_warnings():     # SGLang's import warns of the GPU features a CPU lacks
            warnings.simplefilter("ignore")
            import sglang.srt.managers.scheduler as module
    finally:
        for name in placeholders:
            sys.modules.pop(name, None)
    return module
