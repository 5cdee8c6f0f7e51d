"""A roofline step-time model, for hardware nobody has recorded on.

A step costs the larger of its FLOPs over the peak FLOP/s and its bytes over
the memory bandwidth, plus a fixed overhead per step:

- FLOPs: 2 x (the matmul weights a token goes through) per computed token,
  2 x vocab x hidden per sequence (the logits of its last position only), and
  4 x heads x head_dim per scored (query, key) pair in each layer (QK^T and PV).
  In a MoE model's sparse layers a token goes through the router and its
  top-k experts only (Qwen3-MoE: num_experts_per_tok of num_experts).
- bytes: every weight but the experts once per step (layers, routers and LM
  head); of the experts, those the step's tokens hit, expected as if tokens
  route uniformly (E x (1 - (1 - k/E)^tokens) per sparse layer: k for one
  token, nearly all of them for a long prefill); and the K and V of each
  context token read and of each computed token written, in every layer.

The shape comes from a checkpoint's config.json, of any architecture the
engine runs (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE): they share the layer
layout counted here. What it leaves out (docs/simulation.md): activations,
biases and norms, kernel efficiency and launch gaps (it is a lower bound on
time), tensor parallelism and its collectives, sampling, and the CPU side
beyond the fixed overhead."""
import math
from dataclasses import asdict, dataclass, fields

from tracengine.errors import TracengineError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1, "int8": 1}

# Dense (not sparse) BF16 tensor-core peaks and HBM bandwidth, from NVIDIA's data sheets.
HARDWARE = {
    "H200": (989.5e12, 4.8e12),      # H200 SXM: 989.5 TFLOPS BF16 dense, 4.8 TB/s HBM3e
    "H100": (989.5e12, 3.35e12),     # H100 SXM: 989.5 TFLOPS BF16 dense, 3.35 TB/s HBM3
    "H100-PCIe": (756e12, 2.0e12),   # H100 PCIe: 756 TFLOPS BF16 dense, 2.0 TB/s HBM2e
    "A100": (312e12, 2.039e12),      # A100 SXM 80 GB: 312 TFLOPS BF16 dense, 2.039 TB/s HBM2e
}
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_sparse_layers")
DEFAULT_OVERHEAD_NS = 1_000_000      # 1 ms per step: the scheduler and the framework's launch work


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    dtype: str = ""     # the config's torch_dtype, whose bytes dtype_bytes is ("": a model saved without it)
    # A MoE model (Qwen3-MoE) routes each token to num_experts_per_tok of num_experts experts (gated MLPs
    # of moe_intermediate_size) in num_sparse_layers of its layers; the others, and a dense model's, have
    # one MLP of intermediate_size. All 0 for a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_sparse_layers: int = 0

    @classmethod
    def from_hf_config(cls, config: dict, name: str = "") -> "ModelShape":
        def get(key, default=None):
            value = config.get(key)
            value = default if value is None else value    # a config may write null for "the default"
            _check_positive_int(value, f"model config: {key}")
            return value
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise TracengineError(f"model config: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        num_layers = get("num_hidden_layers")
        moe = (0, 0, 0, 0)
        # transformers writes Qwen3-MoE's num_experts as num_local_experts (Mixtral's name, whose experts
        # have no size of their own: intermediate_size)
        experts_key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
        if config.get(experts_key):
            num_experts, top_k = get(experts_key), get("num_experts_per_tok")
            if top_k > num_experts:
                raise TracengineError(f"model config: num_experts_per_tok {top_k} is more than num_experts "
                                      f"{num_experts}")
            moe = (num_experts, top_k, get("moe_intermediate_size", config.get("intermediate_size")),
                   _num_sparse_layers(num_layers, get("decoder_sparse_step", 1), config.get("mlp_only_layers")))
        return cls(name, hidden, num_layers, heads, get("num_key_value_heads", heads),
                   get("head_dim", hidden // heads), get("intermediate_size"), get("vocab_size"),
                   DTYPE_BYTES[dtype], dtype, *moe)

    @classmethod
    def from_file(cls, path: str) -> "ModelShape":
        import os
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        from tracengine.jsonfile import load_json_object
        config = load_json_object(path, "a model config.json")
        # a checkpoint's config.json is named by its directory, any other file by itself
        stem, _ = os.path.splitext(os.path.basename(path))
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) if stem == "config" else stem
        try:
            return cls.from_hf_config(config, name)
        except TracengineError as exc:
            raise TracengineError(f"{path}: {exc}") from None

    @property
    def attention_params(self) -> int:
        """Weights of one layer's q, k, v and o projections."""
        h, d = self.hidden_size, self.head_dim
        return h * self.num_heads * d + 2 * h * self.num_kv_heads * d + self.num_heads * d * h

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one dense layer's matmuls: q, k, v, o and the gated MLP."""
        return self.attention_params + 3 * self.hidden_size * self.intermediate_size

    @property
    def sparse_layer_shared_params(self) -> int:
        """Weights of a sparse layer's matmuls that every token goes through: attention and the router."""
        return self.attention_params + self.hidden_size * self.num_experts

    @property
    def expert_params(self) -> int:
        """Weights of one expert, a gated MLP."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def active_params_per_token(self) -> int:
        """Matmul weights one token goes through in all layers: in a sparse layer its top-k experts only."""
        dense, sparse = self.num_layers - self.num_sparse_layers, self.num_sparse_layers
        return (dense * self.layer_matmul_params
                + sparse * (self.sparse_layer_shared_params + self.num_experts_per_tok * self.expert_params))

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per(self) -> tuple[int, int, int]:
        """FLOPs per token computed, per sequence (the LM head, on its last token only) and per
        (query, key) pair scored."""
        return (2 * self.active_params_per_token, 2 * self.lm_head_params,
                4 * self.num_layers * self.num_heads * self.head_dim)

    @property
    def weight_bytes(self) -> int:
        """The weights every step reads once: all but the experts."""
        dense, sparse = self.num_layers - self.num_sparse_layers, self.num_sparse_layers
        return (dense * self.layer_matmul_params + sparse * self.sparse_layer_shared_params
                + self.lm_head_params) * self.dtype_bytes

    @property
    def expert_bytes(self) -> int:
        """One expert's weights in every sparse layer."""
        return self.num_sparse_layers * self.expert_params * self.dtype_bytes

    def experts_hit(self, num_tokens: int) -> float:
        """Experts per sparse layer a step's tokens are expected to hit, routed uniformly."""
        if not self.num_sparse_layers:
            return 0.0
        return self.num_experts * (1 - (1 - self.num_experts_per_tok / self.num_experts) ** num_tokens)

    def flops(self, num_tokens: int, num_seqs: int, attended: int) -> int:
        per_token, per_seq, per_pair = self.flops_per
        return per_token * num_tokens + per_seq * num_seqs + per_pair * attended

    def bytes_moved(self, num_tokens: int, context: int) -> float:
        return (self.weight_bytes + self.expert_bytes * self.experts_hit(num_tokens)
                + self.kv_bytes_per_token * (context + num_tokens))


def _num_sparse_layers(num_layers: int, sparse_step: int, mlp_only_layers) -> int:
    """Layers with routed experts, by Qwen3-MoE's rule (model/qwen3_moe.py builds them by the same):
    every sparse_step-th, except the mlp_only_layers."""
    if not (isinstance(mlp_only_layers, list) and all(isinstance(i, int) for i in mlp_only_layers)):
        if mlp_only_layers is not None:
            raise TracengineError(f"model config: mlp_only_layers is a list of layer indices, got {mlp_only_layers!r}")
        mlp_only_layers = []
    return sum(1 for i in range(num_layers) if i not in mlp_only_layers and (i + 1) % sparse_step == 0)


def _check_positive_int(value, what: str):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TracengineError(f"{what} must be a positive integer, got {value!r}")


class RooflineStepTime:
    kind = "roofline"

    def __init__(self, model: ModelShape, peak_flops: float, bandwidth: float,
                 overhead_ns: int = DEFAULT_OVERHEAD_NS, hardware: str = ""):
        # at least 1 FLOP/s and 1 B/s: below, a step's seconds overflow a float to infinity
        if not (peak_flops >= 1 and math.isfinite(peak_flops)) or not (bandwidth >= 1 and math.isfinite(bandwidth)):
            raise TracengineError(f"a roofline needs peak FLOP/s and bandwidth of at least 1, got {peak_flops!r}, "
                                  f"{bandwidth!r}")
        if not (isinstance(overhead_ns, (int, float)) and not isinstance(overhead_ns, bool)
                and math.isfinite(overhead_ns)) or overhead_ns < 0:
            raise TracengineError(f"the per-step overhead is a number of ns >= 0, got {overhead_ns!r}")
        self.model, self.peak_flops, self.bandwidth = model, float(peak_flops), float(bandwidth)
        self.overhead_ns, self.hardware = int(overhead_ns), hardware
        self.gap_ns = self.wake_ns = 0
        # model.flops and model.bytes_moved, their coefficients worked out once: predict runs every step
        self._coefficients = (*model.flops_per, model.weight_bytes, model.kv_bytes_per_token)
        self._moe = model.num_sparse_layers > 0

    @classmethod
    def for_hardware(cls, model: ModelShape, hardware: str | None = None, peak_tflops: float | None = None,
                     bandwidth_tbs: float | None = None, overhead_ms: float | None = None) -> "RooflineStepTime":
        """A preset (HARDWARE) with any figure replaced by a flag; without a preset both figures are needed."""
        if hardware is not None:     # a preset by any case: h200 is the H200
            preset = next((name for name in HARDWARE if name.lower() == hardware.lower()), None)
            if preset is None:
                raise TracengineError(f"unknown hardware {hardware!r}; presets: {', '.join(HARDWARE)}")
            hardware = preset
        peak, bandwidth = HARDWARE.get(hardware, (None, None))
        if peak_tflops is not None:
            peak = peak_tflops * 1e12
        if bandwidth_tbs is not None:
            bandwidth = bandwidth_tbs * 1e12
        if peak is None or bandwidth is None:
            raise TracengineError("a roofline needs --hardware or both --peak-tflops and --bandwidth-tbs")
        if overhead_ms is not None and not (math.isfinite(overhead_ms) and overhead_ms >= 0):
            raise TracengineError(f"--overhead-ms is a number of ms >= 0, got {overhead_ms!r}")
        overhead = DEFAULT_OVERHEAD_NS if overhead_ms is None else round(overhead_ms * 1e6)
        return cls(model, peak, bandwidth, overhead, hardware or "custom")

    def predict(self, is_prefill: bool, num_tokens: int, num_seqs: int, context: int,
                attended: int, mixed: bool = False) -> tuple[int, int, int]:
        # a mixed step costs what its shape does, which counts its decodes: `mixed` changes nothing.
        # A decode step samples every token it computes (a verify step, 1 + its drafts a sequence),
        # so the LM head runs on each; a prefill's, on a sequence's last token.
        per_token, per_seq, per_pair, weight_bytes, kv_bytes_per_token = self._coefficients
        if self._moe:
            weight_bytes += self.model.expert_bytes * self.model.experts_hit(num_tokens)
        num_sampled = num_seqs if is_prefill else num_tokens
        seconds = max((per_token * num_tokens + per_seq * num_sampled + per_pair * attended) / self.peak_flops,
                      (weight_bytes + kv_bytes_per_token * (context + num_tokens)) / self.bandwidth)
        return self.overhead_ns, round(seconds * 1e9), 0

    @property
    def source(self) -> dict:
        # the dtype a simulated trace's header names: the one the weights' and KV's bytes are of
        return {"model": self.model.name, "device": self.hardware,
                "dtype": self.model.dtype or f"{self.model.dtype_bytes}-byte", "dtype_bytes": self.model.dtype_bytes}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": asdict(self.model), "hardware": self.hardware,
                "peak_flops": self.peak_flops, "bandwidth": self.bandwidth, "overhead_ns": self.overhead_ns}

    @classmethod
    def from_dict(cls, d: dict) -> "RooflineStepTime":
        try:
            model = ModelShape(**d["model"])
            peak_flops, bandwidth = d["peak_flops"], d["bandwidth"]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (peak_flops, bandwidth)):
                raise TypeError
        except (KeyError, TypeError):
            raise TracengineError("a roofline model needs model (its shape), peak_flops and bandwidth") from None
        for field in fields(ModelShape):     # counts the cost multiplies by, and a name for the header
            value = getattr(model, field.name)
            if field.name == "name":
                if not isinstance(value, str):
                    raise TracengineError(f"a roofline model's model name is a string, got {value!r}")
            elif field.name == "dtype":
                if not isinstance(value, str) or (value and DTYPE_BYTES.get(value) != model.dtype_bytes):
                    raise TracengineError(f"a roofline model's dtype is one of {', '.join(DTYPE_BYTES)} with "
                                          f"its dtype_bytes, got {value!r}")
            elif field.name in MOE_FIELDS:
                if value != 0:
                    _check_positive_int(value, f"a roofline model's {field.name}")
            else:
                _check_positive_int(value, f"a roofline model's {field.name}")
        moe = [getattr(model, name) for name in MOE_FIELDS]
        if any(moe) and not (all(moe) and model.num_experts_per_tok <= model.num_experts
                             and model.num_sparse_layers <= model.num_layers):
            raise TracengineError(f"a roofline model's {', '.join(MOE_FIELDS)} are all 0 (a dense model) or a "
                                  f"MoE's (top-k at most the experts, sparse layers at most the layers), got {moe}")
        hardware = d.get("hardware", "")
        if not isinstance(hardware, str):
            raise TracengineError(f"a roofline model's hardware is a name, got {hardware!r}")
        return cls(model, peak_flops, bandwidth, d.get("overhead_ns", DEFAULT_OVERHEAD_NS), hardware)
