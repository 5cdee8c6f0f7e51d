"""A capacity search on a workload too small to load the engine reaches its ceiling with every
rate passing: it says the workload never saturated, and prints no ceiling as a capacity."""
import json

from tests.helpers import SWEEP_MODEL, simulate_argv, write_mooncake
from tracengine.cli.main import main


def test_a_search_that_never_saturates_says_so_and_prints_no_rate(tmp_path, capsys):
    roofline = tmp_path / "config.json"
    roofline.write_text(json.dumps(SWEEP_MODEL))
    workload = write_mooncake(tmp_path / "small.jsonl", num_requests=3)
    argv = simulate_argv(workload, str(roofline), "--sweep", "max_num_seqs=1,4", "--search", "request_rate",
                         "--no-cache")
    argv[argv.index("ttft=200ms")] = "ttft=60s"           # three requests all at once meet this
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    assert [row[1:3] for row in rows] == [["never", "saturated"]] * 2
    assert ">=" not in out
    [note] = [line for line in out.splitlines() if line.startswith("never saturated")]
    assert note.startswith("never saturated (max_num_seqs=1; max_num_seqs=4): the 3 requests met the objectives "
                           "at every rate probed, up to ")
    assert "give a workload with more requests" in note
