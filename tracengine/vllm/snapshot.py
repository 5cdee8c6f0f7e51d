"""`vllm_snapshot` (tracengine.testing's fixture): a scripted workload's step table through
vLLM's own scheduler, pinned as tracengine.testing pins tracengine's."""
from pathlib import Path

from tracengine.testing import _StepTableSnapshot


class VllmWorkloadSnapshot(_StepTableSnapshot):
    """A scripted workload through vLLM's own scheduler (installed), driven as vLLM's engine core
    drives it, with made-up tokens (tracengine/vllm/drive.py)."""

    def assert_match(self, requests: list, name: str, *, eos_at: dict[int, int] | None = None,
                     aborts: dict[int, list[int]] | None = None, **config) -> None:
        """Run `requests` (`make_request()`s, entering before their arrival steps, as request
        r{i} for the i-th) through vLLM's scheduler for tracengine.vllm.build.default_config with
        `config`'s vLLM fields (`num_gpu_blocks=32, max_num_batched_tokens=64, scheduler_kind="async",
        policy="priority", ...`) and compare the step table with the snapshot `name`. `eos_at`:
        request index -> the completion index at which it samples EOS; `aborts`: step -> the
        indexes of the requests a client abandons before it is scheduled."""
        __tracebackhide__ = True
        from tracengine.analysis.render import render_steps
        from tracengine.vllm.build import default_config
        from tracengine.vllm.drive import RequestSpec, record_workload
        eos_at = eos_at or {}
        specs = [RequestSpec(f"r{i}", list(r.prompt), r.max_tokens, arrival_step=r.arrival_step,
                             eos_after=eos_at[i] + 1 if i in eos_at else 0) for i, r in enumerate(requests)]
        by_step = {step: [f"r{i}" for i in indexes] for step, indexes in (aborts or {}).items()}
        table = render_steps(record_workload(default_config(**config), specs, aborts=by_step))
        self._check(table, name if Path(name).suffix else name + ".txt", [])
