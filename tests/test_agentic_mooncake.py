"""Dynamo's agentic Mooncake trace read as sessions (workload/agentic_mooncake.py): a play is a
session, its dependencies `depends_on`, its `delay_ms` the think time; simulated with Dynamo's
`fixed` step times it gives what Dynamo 1.6.1's replay gives on the same file."""
import json

import pytest

from tracengine.analysis.stats import stats
from tracengine.cli.main import main
from tracengine.workload.formats import detect_format, read_workload

HEADER = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64, "hash_id_scope": "local",
          "source": {"format": "test", "digest": "tools-v1"}}


def row(request_id, play, hash_ids, input_length, output_length, not_before=0, deps=(), delay=0,
        trigger="completion"):
    return {"request_id": request_id, "play_id": play, "session_id": "main", "model": "any",
            "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids,
            "not_before_ms": not_before,
            "dependencies": [{"request_id": d, "trigger": trigger, "delay_ms": delay, "relation": "sequence"}
                             for d in deps]}


# A root, two tool calls sent 50 ms after it finished, their join 20 ms after both; a second play
# first in the file but later in time; rows out of dependency order (the join before its tools).
AGENT = [HEADER,
         row("late", "p2", [7, 8], 100, 3, not_before=1300),
         row("join", "p1", [1, 2, 3, 5], 200, 2, deps=["tool-b", "tool-a"], delay=20),
         row("root", "p1", [1, 2], 128, 3, not_before=1000),
         row("tool-a", "p1", [1, 2, 3], 150, 2, deps=["root"], delay=50),
         row("tool-b", "p1", [1, 2, 4], 140, 4, deps=["root"], delay=50)]


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def fixed_step_time(path) -> str:
    """Dynamo's `fixed` timing: 100 ms for a step with prompt tokens, plus 10 ms when it decodes."""
    def phase(ms):
        return {part: [ms * 1e6 if part == "model_ns" and i == 0 else 0.0 for i in range(5)]
                for part in ("schedule_ns", "model_ns", "postprocess_ns")}
    path.write_text(json.dumps({"kind": "linear", "features": ["const", "tokens", "seqs", "context", "attended"],
                                "parts": ["schedule_ns", "model_ns", "postprocess_ns"], "gap_ns": 0, "wake_ns": 0,
                                "coefficients": {"prefill": phase(100), "decode": phase(10), "mixed": phase(110)}}))
    return str(path)


def test_a_play_is_a_session_whose_turns_wait_for_their_dependencies(tmp_path):
    workload = write_rows(tmp_path / "agent.jsonl", AGENT)
    assert detect_format(workload) == "agentic_mooncake"
    requests = read_workload(workload, vocab_size=1000)
    assert [(r.session_id, r.turn, r.depends_on, r.think_ns) for r in requests] == [
        ("p1", 0, (), 0), ("p1", 1, (0,), 50_000_000), ("p1", 2, (0,), 50_000_000), ("p1", 3, (1, 2), 20_000_000),
        ("p2", 0, (), 0)]
    # roots at their not_before_ms, from the earliest of any row (a later turn's 0 here), as Dynamo counts
    assert [r.arrival_ns for r in requests if not r.depends_on] == [1_000_000_000, 1_300_000_000]
    assert [len(r.prompt) for r in requests] == [128, 150, 140, 200, 100]       # whole prompts, as recorded
    assert requests[1].prompt[:128] == requests[0].prompt and requests[3].prompt[:150] == requests[1].prompt[:150]
    assert [r.source.rpartition(":")[2] for r in requests] == ["4", "5", "6", "3", "2"]


def test_simulated_it_gives_what_dynamos_replay_gives(tmp_path):
    workload = write_rows(tmp_path / "agent.jsonl", AGENT)
    trace = str(tmp_path / "run.trace")
    assert main(["simulate", workload, "--step-time", fixed_step_time(tmp_path / "fixed.json"), "--quiet",
                 "--scheduling-policy", "mixed", "--block-size", "16", "--num-kvcache-blocks", "1000",
                 "--record", trace]) == 0
    s = stats(trace)
    # Dynamo 1.6.1's run_trace_replay on this file (vllm backend, block 16, fixed 100/10 ms), per
    # request: arrival, TTFT, end-to-end ms; its duration 1,520 ms, cached share 0.5571
    dynamo = {0: (1000, 100, 120), 1: (1170, 100, 110), 2: (1170, 100, 130), 3: (1320, 190, 200),
              4: (1300, 100, 220)}
    assert {r["seq_id"]: (round(r["arrival_s"] * 1e3), round(r["ttft_s"] * 1e3), round(r["e2e_s"] * 1e3))
            for r in s["per_request"]} == dynamo
    assert s["steps"]["total_s"] == pytest.approx(1.52)
    assert s["prefix_cache"]["token_hit_rate"] == pytest.approx(0.5571030640668524)
    assert {x["session_id"]: round(x["duration_s"] * 1e3) for x in s["sessions"]["per_session"]} == \
        {"p1": 520, "p2": 220}


@pytest.mark.parametrize("rows, message", [
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [1, 2], 128, 2, deps=["a"], delay=5, trigger="dispatch")],
     "trigger 'dispatch': tracengine sends a turn after the turns it depends on finished"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [2], 64, 2, deps=["a"], delay=5),
      {**row("c", "p", [3], 64, 2), "dependencies": [
          {"request_id": "a", "trigger": "completion", "delay_ms": 3, "relation": "join"},
          {"request_id": "b", "trigger": "completion", "delay_ms": 50, "relation": "join"}]}],
     "dependencies with different delay_ms (3, 50)"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "q", [1, 2], 128, 2, deps=["a"])],
     "depends on request 'a' of another play ('p')"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [1, 2], 128, 2, not_before=5000, deps=["a"], delay=7)],
     "not_before_ms 5000 may hold request 'b' past its dependencies"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [2], 64, 2, not_before=500)],
     "play 'p' has 2 requests without dependencies"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [2], 64, 2, deps=["a", "c"]),
      row("c", "p", [3], 64, 2, deps=["b"])],
     "play 'p': its dependencies go round in a circle"),
    ([HEADER, row("a", "p", [1], 64, 2), row("b", "p", [2], 64, 2, deps=["nowhere"])],
     "depends on request 'nowhere', which is not in the file"),
    ([HEADER, row("a", "p", [1, 2, 3], 128, 2)], "input_length 128 needs 2 hash_ids of 64 tokens, got 3"),
    ([{**HEADER, "version": 1}, row("a", "p", [1], 64, 2)], "dynamo.agentic_mooncake version 1"),
    ([HEADER, row("a", "p", [1], 64, 2), row("a", "p", [2], 64, 2)], "request_id 'a' is also on"),
    ([HEADER, {**row("a", "p", [1], 64, 2), "priority": 3}], "priority 3: tracengine does not read"),
])
def test_what_it_cannot_send_as_dynamo_does_is_one_line(tmp_path, capsys, rows, message):
    workload = write_rows(tmp_path / "bad.jsonl", rows)
    assert main(["simulate", workload, "--step-time", fixed_step_time(tmp_path / "fixed.json"), "--quiet",
                 "--set", "num_kvcache_blocks=1000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_a_file_named_agentic_must_start_with_its_header(tmp_path, capsys):
    workload = write_rows(tmp_path / "plain.jsonl", AGENT[1:])
    assert main(["simulate", workload, "--workload-format", "agentic_mooncake", "--step-time",
                 fixed_step_time(tmp_path / "fixed.json"), "--quiet"]) == 2
    assert "an agentic Mooncake file starts with its header" in capsys.readouterr().err
