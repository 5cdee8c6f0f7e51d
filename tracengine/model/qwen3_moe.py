"""Qwen3MoeForCausalLM: Qwen3's attention, and in its sparse layers a block
of routed experts in plain torch (a loop over the experts a batch hits; no
fused kernel).

Routing, as Hugging Face's reference does it: softmax over the router's
logits in float32, each token's top_k experts, their probabilities
renormalised to sum to 1 when `norm_topk_prob`, then cast to the model dtype;
a token's output is the weighted sum of its experts' gated MLPs.

Tensor parallelism splits every expert, not the set of experts: each rank
holds all experts with a 1/tp_size slice of each one's intermediate
features (as a dense MLP is split), and the router is replicated, so every
rank routes alike and the block ends in a single all-reduce of the summed
partial outputs."""
import torch
from torch import nn

from tracengine.model.decoder import GatedMLP
from tracengine.model.linear import ReplicatedLinear, get_tp_comm, get_tp_rank_size
from tracengine.model.qwen3 import Qwen3ForCausalLM


class SparseMoeBlock(nn.Module):

    def __init__(self, hf_config):
        super().__init__()
        self.tp_size, self.comm = get_tp_rank_size()[1], get_tp_comm()
        self.num_experts = hf_config.num_experts
        self.top_k = hf_config.num_experts_per_tok
        self.norm_topk_prob = hf_config.norm_topk_prob
        self.gate = ReplicatedLinear(hf_config.hidden_size, self.num_experts)
        self.experts = nn.ModuleList(GatedMLP(hf_config.hidden_size, hf_config.moe_intermediate_size,
                                              reduce_results=False) for _ in range(self.num_experts))

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each [num_tokens, top_k]."""
        probs = torch.softmax(self.gate(hidden), dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights.to(hidden.dtype), expert_ids

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.route(hidden)
        out = torch.zeros_like(hidden)
        # Experts in ascending order, each over its tokens by top-k slot: the reference's order of the sums.
        for expert_id in expert_ids.unique().tolist():
            slot, token_idx = torch.where(expert_ids.T == expert_id)
            y = self.experts[expert_id](hidden[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y)
        if self.tp_size > 1:
            self.comm.all_reduce(out)
        return out


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    # Which experts run depends on the tokens: a captured graph would replay one batch's choice.
    supports_cuda_graphs = False

    def make_mlp(self, hf_config, layer_idx: int) -> nn.Module:
        # The reference's rule: sparse every decoder_sparse_step-th layer, except the mlp_only_layers.
        sparse = (layer_idx not in (getattr(hf_config, "mlp_only_layers", None) or []) and hf_config.num_experts > 0
                  and (layer_idx + 1) % getattr(hf_config, "decoder_sparse_step", 1) == 0)
        if sparse:
            return SparseMoeBlock(hf_config)
        return super().make_mlp(hf_config, layer_idx)
