"""Workload files and arrival processes: each format read from a small sample
file (tests/data/), scaling, and every malformed line as a one-line error."""
import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.errors import TracengineError
from tracengine.sim.runners import SyntheticRunner
from tracengine.trace.events import BlockAllocate
from tracengine.trace.sinks import ListSink
from tracengine.workload import Request, arrival_times, detect_format, read_workload
from tracengine.workload.arrivals import check_rate
from tracengine.cli import main
from tracengine.cli.flags import add_workload_arguments, workload_spec
from tracengine.workload.sources import sampling_params, workload_requests

DATA = Path(__file__).parent / "data"
MOONCAKE, AZURE, OWN = DATA / "mooncake_sample.jsonl", DATA / "azure_sample.csv", DATA / "tracengine_sample.jsonl"
VOCAB = 1024


# -- arrivals ---------------------------------------------------------------------------------------

def test_infinite_rate_puts_every_request_at_zero():
    assert arrival_times(5) == [0.0] * 5
    assert arrival_times(3, math.inf, seed=9) == [0.0] * 3


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_gaps_follow_the_gamma_process(burstiness):
    rate, n = 4.0, 40_000
    times = arrival_times(n, rate, burstiness, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    # mean gap 1 / rate = 0.25 s whatever the burstiness
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # Gamma(k, theta): variance k theta^2, so the squared coefficient of variation is 1 / k
    cv2 = statistics.pvariance(gaps) / statistics.fmean(gaps) ** 2
    assert cv2 == pytest.approx(1 / burstiness, rel=0.08)


def test_arrivals_are_seeded():
    assert arrival_times(50, 2.0, seed=3) == arrival_times(50, 2.0, seed=3)
    assert arrival_times(50, 2.0, seed=3) != arrival_times(50, 2.0, seed=4)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_bad_rates_are_refused(rate):
    with pytest.raises(TracengineError, match="--request-rate expects a positive number or inf"):
        check_rate(rate)


def test_bad_burstiness_is_refused():
    with pytest.raises(TracengineError, match="burstiness must be a positive number"):
        arrival_times(3, 1.0, 0.0)


# -- formats ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, name", [(MOONCAKE, "mooncake"), (AZURE, "azure"), (OWN, "tracengine")])
def test_formats_are_detected(path, name):
    assert detect_format(str(path)) == name


def test_mooncake_prompts_are_built_from_hash_ids():
    requests = read_workload(str(MOONCAKE), vocab_size=VOCAB)
    assert [len(r.prompt) for r in requests] == [1000, 600, 300, 1100]
    assert [r.max_tokens for r in requests] == [10, 4, 1, 2]      # an output length of 0 runs as 1
    assert [r.arrival_s for r in requests] == [0.0, 0.5, 1.5, 1.5]  # ms, from the first request
    assert all(r.ignore_eos for r in requests)
    assert all(0 <= t < VOCAB for r in requests for t in r.prompt)
    r0, r1, r2, r3 = (r.prompt for r in requests)
    assert r1[:512] == r0[:512] and r1[512:] != r0[512:600]      # hash id 0 shared, then 2 vs 1
    assert r3[:1000] == r0                                        # ids 0, 1: the last block was cut to 1000
    assert r2[:300] != r0[:300]
    assert requests[3].source == f"{MOONCAKE}:5"                  # the blank line counts
    # the same ids give the same tokens in another read
    assert read_workload(str(MOONCAKE), vocab_size=VOCAB)[0].prompt == r0


@pytest.mark.parametrize("block_size", [4, 16])
def test_shared_hash_ids_hit_the_prefix_cache(block_size):
    """Requests 0 and 3 share hash ids 0 and 1: request 3's first blocks are cache hits at
    any block size (lengths scaled to 1/20: blocks of ceil(512 / 20) = 26 tokens)."""
    requests = read_workload(str(MOONCAKE), vocab_size=VOCAB, length_scale=0.05)
    assert [len(r.prompt) for r in requests] == [50, 30, 15, 55]
    sink = ListSink()
    engine = LLMEngine(Config(num_kvcache_blocks=256, kvcache_block_size=block_size, max_model_len=256, eos=-1),
                       SyntheticRunner(VOCAB), sink)
    for r in requests:       # one at a time, so each finds the blocks of those before it registered
        engine.add_request(r.prompt, sampling_params(r))
        while not engine.is_finished():
            engine.step()
    hits = {e.seq_id: e.num_cached_blocks for e in sink.events if isinstance(e, BlockAllocate)}
    assert hits[0] == 0 and hits[2] == 0
    assert hits[1] == 26 // block_size        # hash id 0 only: 26 shared tokens
    assert hits[3] == 50 // block_size        # request 0's whole prompt (50 tokens) is request 3's prefix


def test_azure_arrivals_come_from_datetimes():
    requests = read_workload(str(AZURE), vocab_size=VOCAB)
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 1.75]
    assert [(len(r.prompt), r.max_tokens) for r in requests] == [(120, 12), (64, 3), (300, 40)]
    assert all(r.ignore_eos and 0 <= min(r.prompt) and max(r.prompt) < VOCAB for r in requests)
    assert requests[0].prompt[:64] != requests[1].prompt      # no content in the trace: no shared prefixes
    assert requests[2].source == f"{AZURE}:4"


def test_own_format_keeps_prompts_and_sampling_fields():
    requests = read_workload(str(OWN), vocab_size=VOCAB)
    assert requests[0] == Request("Why does a request wait in the queue?", 8, 0, source=f"{OWN}:1")
    assert requests[1] == Request([11, 12, 13, 14, 15, 16], 4, 250_000_000, 0.0, True, source=f"{OWN}:2")
    assert requests[2] == Request([11, 12, 13, 14, 21], 64, 500_000_000, 0.7, False, 20, 0.9, 7, source=f"{OWN}:3")


def test_scales_and_max_requests():
    requests = read_workload(str(MOONCAKE), vocab_size=VOCAB, time_scale=2.0, length_scale=0.1, max_requests=3)
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 0.75]                 # twice as fast
    assert [len(r.prompt) for r in requests] == [100, 60, 30]
    assert [r.max_tokens for r in requests] == [1, 1, 1]                        # round(10 * 0.1) = 1, at least 1
    tiny = read_workload(str(AZURE), vocab_size=VOCAB, length_scale=0.001)
    assert [(len(r.prompt), r.max_tokens) for r in tiny] == [(1, 1), (1, 1), (1, 1)]
    assert [len(r.prompt) for r in read_workload(str(OWN), "tracengine", vocab_size=VOCAB, max_requests=2)[1:]] == [6]


def parse(argv):
    p = argparse.ArgumentParser()
    for name in ("--prompt", "--max-tokens", "--temperature", "--num-prompts", "--prompt-lens", "--prompts-file"):
        p.add_argument(name, type=int if name in ("--num-prompts", "--max-tokens") else None,
                       action="append" if name == "--prompt" else None)
    p.add_argument("--ignore-eos", action="store_true", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-len")
    p.add_argument("--output-len")
    add_workload_arguments(p)
    return workload_spec(p.parse_args(argv))


def test_command_line_arrivals_for_any_source():
    requests = workload_requests(parse(["--num-prompts", "20", "--request-rate", "5", "--seed", "2"]), VOCAB)
    assert [r.arrival_ns for r in requests] == [round(t * 1e9) for t in arrival_times(20, 5.0, 1.0, 2)]
    from_file = workload_requests(parse(["--workload", str(MOONCAKE), "--request-rate", "2", "--max-tokens", "3"]),
                                  VOCAB)
    assert [r.arrival_ns for r in from_file] == [round(t * 1e9) for t in arrival_times(4, 2.0, 1.0, 0)]    # the rate replaces the file's times
    assert {r.max_tokens for r in from_file} == {3}
    assert [r.arrival_s for r in workload_requests(parse(["--workload", str(AZURE)]), VOCAB)] == [0.0, 0.25, 1.75]
    assert len(workload_requests(parse(["--num-prompts", "9", "--max-requests", "4"]), VOCAB)) == 4


@pytest.mark.parametrize("argv, message", [
    (["--num-prompts", "3", "--time-scale", "2"], "apply to a --workload file"),
    (["--num-prompts", "3", "--workload-format", "azure"], "apply to a --workload file"),   # was ignored
    (["--num-prompts", "3", "--burstiness", "0.5"], "give a rate"),
    (["--workload", str(AZURE), "--num-prompts", "3"], "choose one of"),
    (["--workload", str(AZURE), "--max-requests", "0"], "--max-requests must be positive"),
])
def test_conflicting_flags(argv, message):
    with pytest.raises(TracengineError, match=message):
        workload_requests(parse(argv), VOCAB)


def test_unsupported_sampling_field_is_named():
    request = read_workload(str(OWN), vocab_size=VOCAB)[2]
    if "top_k" in sampling_params.__globals__["SamplingParams"].__dataclass_fields__:
        assert sampling_params(request).top_k == 20
    else:
        with pytest.raises(TracengineError, match=r"tracengine_sample.jsonl:3: top_k is not supported"):
            sampling_params(request)


MOONCAKE_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}'


@pytest.mark.parametrize("name, lines, message", [
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 600, "hash_ids": [0, 1]}'],
     ":2: missing field 'output_length'"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": -600, "output_length": 4, "hash_ids": [0]}'],
     ":2: input_length is negative"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 6, "output_length": -4, "hash_ids": [0]}'],
     ":2: output_length is negative"),
    ("a.jsonl", ['{"timestamp": 9, "input_length": 6, "output_length": 4, "hash_ids": [0]}', MOONCAKE_LINE],
     ":2: arrival time goes back"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0]}'],
     ":2: input_length 600 needs 2 hash_ids"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 6, "output_length": 4, "hash_ids": [-1]}'],
     ":2: a hash id is negative"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, -7]}'],
     ":2: a hash id is negative (-7)"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 1600, "output_length": 4, "hash_ids": [0, 1, true, 3]}'],
     ":2: a hash id must be an integer, got True"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 1600, "output_length": 4, "hash_ids": [0, 1, 3, 2.0]}'],
     ":2: a hash id must be an integer, got 2.0"),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, %d]}'
                 % 2**54], ":2: hash id %d is too large: a hash id names its 512 tokens as 64-bit ids, so it must "
     "be below %d (2**54)" % (2**54, 2**54)),
    ("a.jsonl", [MOONCAKE_LINE, '{"timestamp": 5, "input_length": 6'], ":2: not valid JSON"),
    ("a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-01-01 00:00:01,5,5", "2024-01-01 00:00:00,5,5"],
     ":3: arrival time goes back"),
    ("a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-01-01 00:00:01,-5,5"], ":2: ContextTokens is negative"),
    ("a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "yesterday,5,5"], ":2: TIMESTAMP is not a date and time"),
    ("a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-01-01 00:00:01,5"], ":2: 2 columns"),
    ("a.csv", ["TIMESTAMP,ContextTokens", "2024-01-01 00:00:01,5"], ":1: missing column 'GeneratedTokens'"),
    ("a.jsonl", ['{"arrival_s": 0, "prompt": "hi"}', '{"prompt": "hi"}'], ":2: missing field 'arrival_s'"),
    ("a.jsonl", ['{"arrival_s": 1, "prompt": "hi"}', '{"arrival_s": 0.5, "prompt": "hi"}'], ":2: arrival time goes back"),
    ("a.jsonl", ['{"arrival_s": 0, "prompt": "hi", "max_tokens": -3}'], ":1: max_tokens is negative"),
    ("a.jsonl", ['{"arrival_s": 0, "prompt": "hi", "max_token": 3}'], ":1: unknown field 'max_token'"),
    ("a.jsonl", ['{"arrival_s": 0, "prompt_token_ids": [1, 5000]}'], ":1: token id 5000 is outside the vocabulary"),
    ("a.jsonl", ['{"arrival_s": 0}'], ":1: give one of 'prompt' or 'prompt_token_ids'"),
    ("a.jsonl", ['{"arrival_s": 0, "prompt": "hi", "top_p": 0}'], ":1: top_p must be in (0, 1]"),
    ("a.txt", ["", "just some text"], ":2: unknown workload format"),
    ("a.jsonl", ['{"ts": 1}'], ":1: unknown workload format"),
])
def test_malformed_lines_are_one_line_errors(tmp_path, name, lines, message):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TracengineError) as info:
        read_workload(str(path), vocab_size=VOCAB)
    text = str(info.value)
    assert "\n" not in text and text.startswith(str(path)) and message in text


@pytest.mark.parametrize("input_length, num_hash_ids", [(600, 3), (100, 1_000_000)])
def test_a_mooncake_row_with_more_hash_ids_than_blocks_is_named(tmp_path, input_length, num_hash_ids):
    """One hash id per 512-token block: more are ids of no block of the prompt (a row made for
    another block size), not ids to drop."""
    path = tmp_path / "a.jsonl"
    path.write_text(MOONCAKE_LINE + "\n" + json.dumps({"timestamp": 5, "input_length": input_length,
                                                       "output_length": 4, "hash_ids": list(range(num_hash_ids))}))
    needed = -(-input_length // 512)
    with pytest.raises(TracengineError) as info:
        read_workload(str(path), vocab_size=VOCAB)
    assert str(info.value) == (f"{path}:2: input_length {input_length} needs {needed} hash_ids of 512 tokens, "
                               f"got {num_hash_ids} (more than its blocks)")


def test_a_prompt_that_can_never_fit_names_its_line():
    with pytest.raises(TracengineError, match=r"mooncake_sample.jsonl:5: a prompt of 1100 tokens can never fit "
                                              r"max_model_len=1024"):
        read_workload(str(MOONCAKE), vocab_size=VOCAB, max_model_len=1024)
    assert len(read_workload(str(MOONCAKE), vocab_size=VOCAB, max_model_len=1024, length_scale=0.5)) == 4


def test_unknown_format_name_and_empty_file(tmp_path):
    with pytest.raises(TracengineError, match="unknown workload format 'sharegpt'"):
        read_workload(str(MOONCAKE), "sharegpt", vocab_size=VOCAB)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TracengineError, match="empty.jsonl: no requests"):
        read_workload(str(empty), vocab_size=VOCAB)


@pytest.mark.parametrize("head, format", [(b"TRCE\x03\x00\x80\x81", None), (MOONCAKE.read_bytes(), "mooncake"),
                                           (AZURE.read_bytes(), "azure")])
def test_a_workload_file_that_is_not_utf8_is_a_one_line_error(tmp_path, head, format):
    """Bytes that are not text (a trace given for a workload), at its start or past its first line."""
    path = tmp_path / "w.bin"
    path.write_bytes(head + b"\n\xff\xfe\n" + b"x" * 20_000)
    with pytest.raises(TracengineError, match="w.bin: not a workload file .not UTF-8"):
        read_workload(str(path), format, vocab_size=VOCAB)


def test_the_workload_readers_import_no_torch():
    code = "import sys, tracengine.workload.sources; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mooncake_block_tokens_are_pinned():
    """A hash id's made-up tokens are part of every simulation of a Mooncake file: the same
    ids give the same tokens in every version, so traces of one workload compare."""
    import struct
    import xxhash
    from tracengine.workload.rows import block_token_ids
    assert block_token_ids(0, 8, 1000) == (237, 998, 356, 514, 205, 92, 970, 122)
    tokens = block_token_ids(123456, 512, 151936)
    assert len(tokens) == 512 and max(tokens) == 151772
    assert xxhash.xxh64_hexdigest(struct.pack("<512q", *tokens)) == "de4c306c9cbf420b"


@pytest.mark.parametrize("command", ["generate", "simulate"])
def test_an_arrival_past_the_traces_clock_is_refused_before_the_run(tmp_path, capsys, command):
    # 10**17 ms: 10**14 s, past the 2**63 ns a trace records (generate's wait for it overflowed sleep)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 4, "hash_ids": [{i}]}}\n'
                                for i, t in enumerate((0, 10**17))))
    old = tmp_path / "run.trace"
    old.write_bytes(b"the old trace")
    source = [str(workload), "--step-time", str(DATA / "fixed_steptime.json")] if command == "simulate" \
        else ["--workload", str(workload)]
    assert main([command, *source, "--num-kvcache-blocks", "64", "--record", str(old), "--force"]) == 2
    err = capsys.readouterr().err
    assert err == (f"tracengine: error: {workload}:2 arrives 1e+14 s into the run, past the 292 years a trace's "
                   f"clock (ns, 64-bit) holds\n")
    assert old.read_bytes() == b"the old trace" and sorted(p.name for p in tmp_path.iterdir()) == ["run.trace", "w.jsonl"]
    with pytest.raises(TracengineError, match="a request arrives .* past the 292 years"):
        workload_requests(workload_spec(argparse.Namespace(num_prompts=3, request_rate=1e-12)), 1000)


def test_a_hash_id_past_the_64_bit_token_layout_is_refused_before_the_run(tmp_path, capsys):
    """A hash id h stands for tokens h * 512 .., hashed as int64s: 2**54 and above would overflow
    them in the middle of a run, a --force target already replaced. The largest one that fits runs."""
    workload = tmp_path / "w.jsonl"
    old = tmp_path / "run.trace"
    old.write_bytes(b"the old trace")
    for hash_id, rc in ((2**55, 2), (2**54, 2), (2**54 - 1, 0)):
        workload.write_text("".join(f'{{"timestamp": {t}, "input_length": 600, "output_length": 4, '
                                    f'"hash_ids": [{i}, {hash_id if t else i + 1}]}}\n' for i, t in enumerate((0, 5))))
        argv = ["simulate", str(workload), "--step-time", str(DATA / "fixed_steptime.json"), "--num-kvcache-blocks",
                "256", "--block-size", "16", "--quiet", "--record", str(old), "--force"]
        assert main(argv) == rc
        out, err = capsys.readouterr()
        if rc:
            assert err == (f"tracengine: error: {workload}:2: hash id {hash_id} is too large: a hash id names its "
                           f"512 tokens as 64-bit ids, so it must be below {2**54} (2**54)\n")
            assert old.read_bytes() == b"the old trace"
    assert main(["check", str(old)]) == 0
    from tracengine.engine.hash_id_prompt import HashIdPrompt, hash_id_limit
    assert hash_id_limit(512) == 2**54 and hash_id_limit(100) == 2**63 // 100
    with pytest.raises(ValueError, match="below"):
        HashIdPrompt([2**54], 10)
    assert len(HashIdPrompt([2**54 - 1], 512).block_hashes(16)) == 32
