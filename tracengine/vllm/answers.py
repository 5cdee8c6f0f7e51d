"""What a replay's scheduler is told from the trace besides requests, aborts and tokens: the
recorded KV connector's answers (connector.py) and the recorded grammars (structured.py)."""
from tracengine.vllm.connector import answer_connector
from tracengine.vllm.structured import answer_grammars


def answer_from(scheduler, frames) -> None:
    answer_connector(scheduler, frames)
    answer_grammars(scheduler, frames)
