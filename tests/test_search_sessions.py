"""The capacity search of a sessions file targets sessions per second: the rate is its sessions'
first turns' (a later turn is still sent its think time after its session's finishes), and the
output says so. The rate found, written into the file as its first turns' arrivals, meets the
goodput; one step above it does not."""
import json
from pathlib import Path

from tracengine.analysis.stats import stats
from tracengine.cli.main import main

FIXED = str(Path(__file__).parent / "data" / "fixed_steptime.json")    # prefill step 100 ms, decode 10 ms
SETTINGS = ["--step-time", FIXED, "--set", "num_kvcache_blocks=2000", "--set", "max_num_batched_tokens=1024"]


def sessions_file(path, gap_ms: float, num_sessions=41, num_turns=3) -> str:
    """Sessions starting `gap_ms` apart (41 of them 250 ms apart: 4 sessions/s), 3 turns each,
    each later turn 300 ms after the one before."""
    rows = [{"session_id": f"s{s}", **({"timestamp": gap_ms * s} if t == 0 else {"think_ms": 300}),
             "input_length": 600 if t == 0 else 80, "output_length": 20}
            for t in range(num_turns) for s in range(num_sessions)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def good_share(tmp_path, sessions_per_s: float) -> float:
    workload = sessions_file(tmp_path / f"at_{sessions_per_s:g}.jsonl", 1000 / sessions_per_s)
    trace = str(tmp_path / f"at_{sessions_per_s:g}.trace")
    assert main(["simulate", workload, *SETTINGS, "--quiet", "--record", trace]) == 0
    return stats(trace, {"ttft": 0.25}).goodput.good_request_share


def test_a_sessions_files_capacity_is_in_sessions_per_second(tmp_path, capsys):
    workload = sessions_file(tmp_path / "sessions.jsonl", 250)
    assert main(["simulate", workload, *SETTINGS, "--slo", "ttft=250ms", "--goodput", "0.95", "--search",
                 "request_rate", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("capacity of 41 sessions (123 turns) with ")
    assert "95.0% of the turns meet ttft 250 ms, to 0.1 sessions/s (sessions started per second" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["max", "sessions/s"])
    rate, share, next_share = lines[header + 1].split()[:3]
    rate = float(rate)
    assert 4 < rate < 41          # loaded beyond the file's own 4 sessions/s, short of all at once
    # the rate found, as the file's first turns' own arrivals, meets the goodput; one step above does not
    at, above = good_share(tmp_path, rate), good_share(tmp_path, round(rate + 0.1, 9))
    assert at >= 0.95 and f"{at:.1%}" == share
    assert above < 0.95 and f"{above:.1%}" == next_share
