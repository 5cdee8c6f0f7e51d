"""The engine interface: what every verb (simulation, the what-if in simulated time, sweeps,
the capacity search) asks of an engine, whichever it is, in the spirit of vLLM's
`SchedulerInterface` and `EngineCore.step`:

- `add(index, request)`: a request arrives (at its `arrival_ns` on the engine's clock; one
  without a seq_id is numbered by its index in the workload);
- `abort(request_id, reason) -> bool`: its client leaves (False: the engine no longer holds it);
- `step() -> Stepped` (sim/clock.py): the engine's next step, which emits that step's events;
  what finished (a session's next turn waits on it), what its departures took out, whether a
  step ran, and when it ended;
- `is_finished() -> bool`: nothing queued, waiting, running or in flight;
- `next_step_ns() -> int | None`: the clock: when its next step starts (None: idle, until a
  request comes); `stuck_reason()` when it is neither finished nor has a step to take.

Four implementations: tracengine's own engine (`sim/clock.ClockedEngine` over
`sim/engine.SimulatedEngine`), vLLM's scheduler (`vllm/timed.VllmClockedEngine`), SGLang's
(`sglang/timed.SglangClockedEngine`) and a fleet of engines behind routers, itself an engine
made of engines (`fleet/engine.Fleet`). The one
loop over it is `sim/clock.run_in_time`. On the wall clock, `LLMEngine` (llm_engine.py) is the
same engine driven by `generate` and `serve`: its requests arrive when they are sent and its
steps start when the last one ends."""
from typing import Protocol


class Engine(Protocol):
    def add(self, index: int, request) -> None: ...

    def abort(self, request_id, reason: str) -> bool: ...

    def step(self): ...

    def is_finished(self) -> bool: ...

    def next_step_ns(self) -> int | None: ...

    def stuck_reason(self) -> str: ...
