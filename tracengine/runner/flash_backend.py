"""Paged attention through flash-attn (CUDA only, imported lazily, only
where it is installed): used when the block size is a multiple of 256, which
its paged kernels require. Each layer's cache is [num_blocks, block_size,
num_kv_heads, head_dim], flash-attn's paged layout."""
import torch

from tracengine.model.context import Context


def flash_attn_usable(device: torch.device, block_size: int) -> bool:
    if device.type != "cuda" or block_size % 256 != 0:
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor):
    """key, value: [num_tokens, num_kv_heads, head_dim]. Rows that must not
    land anywhere (CUDA-graph padding) point at the runner's scratch block,
    so the copy needs no mask and no host sync."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)


def flash_prefill_attention(q, k, v, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func
    if context.block_tables is not None:
        k, v = k_cache, v_cache
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q=context.cu_seqlens_q, cu_seqlens_k=context.cu_seqlens_k,
                                  max_seqlen_q=context.max_seqlen_q, max_seqlen_k=context.max_seqlen_k,
                                  softmax_scale=scale, causal=True, block_table=context.block_tables)


def flash_decode_attention(q, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    from flash_attn import flash_attn_with_kvcache
    return flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=context.context_lens,
                                   block_table=context.block_tables, softmax_scale=scale, causal=True).squeeze(1)


def flash_attention(layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: Context) -> torch.Tensor:
    k_cache, v_cache = layer.k_cache, layer.v_cache
    if k_cache.numel():   # empty during the memory-profiling warmup
        store_kvcache(k, v, k_cache, v_cache, context.slot_mapping)
    if context.is_prefill:
        return flash_prefill_attention(q, k, v, k_cache, v_cache, context, layer.scale)
    return flash_decode_attention(q, k_cache, v_cache, context, layer.scale)
