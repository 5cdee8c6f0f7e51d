"""LLM.generate(record=...) that fails: its trace says why, as the commands' traces do."""
import pytest
from tracengine import LLM, SamplingParams
from tracengine.trace.tracelog import TraceReader

def test_a_failed_generate_records_why(tmp_path, monkeypatch):
    path = tmp_path / "run.trace"
    with LLM(num_kvcache_blocks=16) as llm:
        calls = []
        step = llm.step
        def failing_step():
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("the model broke")
            return step()
        monkeypatch.setattr(llm, "step", failing_step)
        with pytest.raises(RuntimeError):
            llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=8, ignore_eos=True), record=str(path), use_tqdm=False)
    with TraceReader(path) as reader:
        list(reader.events())
        assert reader.run_end is not None and reader.run_end.outcome == "failed"
        assert "the model broke" in reader.run_end.reason
