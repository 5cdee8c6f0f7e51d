"""What a replay's scheduler is told from the trace besides requests, aborts and tokens: the
recorded KV connector's answers (connector.py) and the recorded grammars (structured.py)."""
from tracengine.vllm.connector import answer_connector
from tracengine.vllm.structured import answer_grammars


def answer_from(scheduler, frames) -> None:
    answer_connector(scheduler, frames)
    answer_grammars(scheduler, frames)


def refuse_whatif(header, events, in_time: bool = False) -> None:
    """A what-if runs the recorded requests under another config: a connector's answers and a
    grammar's readiness were given to the recorded schedule, and another schedule would ask other
    questions, which nothing can answer without the connector and the grammars: a ConfigError.
    Native CPU offloading's connector is vLLM's own and runs in simulated time (`in_time`:
    offloading.py), with transfer times from the bandwidth."""
    from tracengine.errors import ConfigError
    from tracengine.trace.vllm_events import GrammarRequested
    from tracengine.vllm.offloading import is_native_offloading
    native = is_native_offloading(header.config)
    if header.config.get("kv_connector") and not (in_time and native):
        where = " in steps (in simulated time, --step-time or --roofline, vLLM's connector runs)" if native else ""
        raise ConfigError(f"a what-if{where} of a trace recorded with a KV connector "
                          f"({header.config['kv_connector']}) cannot run: the connector's answers hold for the "
                          f"recorded schedule only (replay re-executes it exactly)")
    if any(type(e) is GrammarRequested for e in events):
        raise ConfigError("a what-if of a trace with structured output cannot run: its grammars' readiness holds "
                          "for the recorded schedule only (replay re-executes it exactly)")
