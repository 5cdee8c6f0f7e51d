"""Per LoRA adapter figures of a trace of vLLM's scheduler (`stats`' "lora_adapters",
docs/stats.md): its requests' counts, tokens and latencies in steps, by adapter name; the base
model's requests under "". None for a trace without adapters."""
from tracengine.analysis.figures import Adapter, summarize


def adapter_figures(per_request: list, lora_names: dict[int, str]) -> dict[str, Adapter] | None:
    if not lora_names:
        return None
    groups: dict[str, list] = {}
    for r in per_request:
        groups.setdefault(lora_names.get(r.seq_id, ""), []).append(r)

    def steps(rs, name):
        return summarize([v for r in rs if (v := getattr(r, name)) is not None])
    return {name: Adapter(num_requests=len(rs), num_finished=sum(r.finish_step is not None for r in rs),
                          num_prompt_tokens=sum(r.num_prompt_tokens for r in rs),
                          num_completion_tokens=sum(r.num_completion_tokens for r in rs),
                          queueing_steps=steps(rs, "queueing_steps"), ttft_steps=steps(rs, "ttft_steps"),
                          e2e_steps=steps(rs, "e2e_steps"))
            for name, rs in sorted(groups.items())}
