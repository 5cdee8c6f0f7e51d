"""What a new user tries: existing files are never overwritten without --force
and never written before the run is validated; bad input is one line and exit 2;
help, --json, --output, the progress bar on stderr, Hugging Face ids; the
Python API's prompts and sampling parameters."""
import json
import os
import shutil
import threading

import pytest

from tracengine import LLM, SamplingParams
from tracengine.cli import main
from tracengine.cli.main import build_parser
from tracengine.errors import ModelError, RequestError
from tracengine.model import EMBEDDED_MODEL_DIR
from tracengine.trace.tracelog import TraceReader

TINY = ["--quiet", "--prompt-lens", "25,8,6", "--max-tokens", "3", "--temperature", "0"]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def files_of(directory) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def assert_refused(capsys, tmp_path, argv, match):
    """One line on stderr, exit 2, and every file in tmp_path as it was."""
    before = files_of(tmp_path)
    code, out, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("tracengine: error: ") and match in lines[0], err
    assert files_of(tmp_path) == before


@pytest.fixture
def trace(tmp_path, capsys):
    path = tmp_path / "run.trace"
    assert run_cli(capsys, "generate", *TINY, "--record", path)[0] == 0
    return path


# --- files a user already has ----------------------------------------------------------------------------

def test_outputs_that_exist_are_refused_without_force(tmp_path, capsys, trace):
    other = tmp_path / "other.txt"
    other.write_text("keep me")
    assert_refused(capsys, tmp_path, ["generate", *TINY, "--record", other], "exists; give --force")
    assert_refused(capsys, tmp_path, ["generate", *TINY, "--output", other], "exists; give --force")
    assert_refused(capsys, tmp_path, ["replay", trace, "--set", "num_kvcache_blocks=32", "--record", other],
                   "exists; give --force")
    assert_refused(capsys, tmp_path, ["export", trace, "--perfetto", other], "exists; give --force")


def test_force_overwrites(tmp_path, capsys, trace):
    other = tmp_path / "other.txt"
    other.write_text("replace me")
    assert run_cli(capsys, "export", trace, "--perfetto", other, "--force")[0] == 0
    assert json.loads(other.read_text())["traceEvents"]
    assert run_cli(capsys, "generate", *TINY, "--record", other, "--force")[0] == 0
    assert run_cli(capsys, "check", other)[0] == 0


def test_a_device_or_a_pipe_is_written_in_place_without_force(tmp_path, capsys, trace):
    """Only a regular file that exists needs --force: a device or a named pipe is written in
    place (no writer replaces it); a link to a regular file still needs it."""
    for argv in (["generate", *TINY, "--record", os.devnull], ["generate", *TINY, "--output", os.devnull],
                 ["replay", trace, "--arrivals", "steps", "--set", "num_kvcache_blocks=32", "--record", os.devnull],
                 ["export", trace, "--perfetto", os.devnull]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and not err, (argv, err)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()))
    reader.start()
    code, _, err = run_cli(capsys, "export", trace, "--perfetto", fifo)
    reader.join(timeout=60)
    assert code == 0 and not err and json.loads(read[0])["traceEvents"]
    assert fifo.is_fifo()
    target = tmp_path / "kept.json"
    target.write_text("keep me")
    (tmp_path / "link.json").symlink_to(target)
    assert_refused(capsys, tmp_path, ["export", trace, "--perfetto", tmp_path / "link.json"], "exists; give --force")


def test_an_output_is_never_an_input(tmp_path, capsys, trace):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    for argv in (["replay", trace, "--set", "num_kvcache_blocks=32", "--record", trace, "--force"],
                 ["export", trace, "--perfetto", trace, "--force"]):
        assert_refused(capsys, tmp_path, argv, "is the trace it reads")
    assert_refused(capsys, tmp_path, ["generate", "--quiet", "--prompts-file", prompts, "--record", prompts, "--force"],
                   "is the prompts file it reads")
    new = tmp_path / "new.trace"
    assert_refused(capsys, tmp_path, ["generate", *TINY, "--record", new, "--output", new], "name the same file")


@pytest.mark.parametrize("argv, match", [
    (["--prompt-lens", "5000"], "longer than max_model_len"),
    (["--prompt-lens", "40", "--num-kvcache-blocks", "2"], "the cache has 2"),
    (["--prompt", ""], "empty prompt"),
])
def test_nothing_is_written_before_the_run_is_validated(tmp_path, capsys, argv, match):
    old = tmp_path / "old.trace"
    old.write_bytes(b"an older trace")
    assert_refused(capsys, tmp_path, ["generate", "--quiet", *argv, "--record", old, "--force"], match)
    assert_refused(capsys, tmp_path, ["generate", "--quiet", *argv, "--record", tmp_path / "new.trace"], match)
    # a named pipe is recorded in place: refused before anything is written to it
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()))
    reader.start()
    with open(fifo, "wb"):    # the reader sees an end even if nothing else opens the pipe
        code, _, err = run_cli(capsys, "generate", "--quiet", *argv, "--record", fifo)
    reader.join(timeout=60)
    assert code == 2 and match in err and read == [b""]


# --- inputs that gave tracebacks or were ignored -----------------------------------------------------------

@pytest.mark.parametrize("content, match", [
    (b'{"prompt": 5}\n', "prompts.jsonl:1: 'prompt' must be a non-empty string or list of token ids, got 5"),
    (b'hello\n{"prompt": null}\n', "prompts.jsonl:2: 'prompt' must be a non-empty string"),
    (b'{"prompt": ""}\n', "'prompt' must be a non-empty string"),
    (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not UTF-8 text"),
    (b"a\x00b\n", "a NUL byte"),
])
def test_bad_prompts_files(tmp_path, capsys, content, match):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    assert_refused(capsys, tmp_path, ["generate", "--quiet", "--prompts-file", path], match)


@pytest.mark.parametrize("argv, match", [
    (["--prompt", "a", "--max-tokens", "0"], "max_tokens must be a positive integer, got 0"),
    (["--input-len", "9:3"], "--input-len shapes the synthetic workload; give --num-prompts"),
    (["--output-len", "4:8"], "--output-len shapes the synthetic workload; give --num-prompts"),
])
def test_generate_flags_that_were_ignored(tmp_path, capsys, argv, match):
    assert_refused(capsys, tmp_path, ["generate", "--quiet", *argv], match)


def test_empty_prompt_in_the_python_api_is_a_request_error():
    with LLM("", num_kvcache_blocks=16) as llm:
        with pytest.raises(RequestError, match="empty prompt"):
            llm.generate([""], use_tqdm=False)
        with pytest.raises(RequestError, match="a prompt is a string or a list of token ids"):
            llm.generate([5.0], use_tqdm=False)


@pytest.mark.parametrize("argv, match", [
    (["--step", "5:2"], "0 <= A < B, got '5:2'"),
    (["--step", "-1"], "a step >= 0"),
    (["--seq", "-3"], "--seq expects a sequence id >= 0, got -3"),
])
def test_events_filters_that_can_match_nothing_are_errors(tmp_path, capsys, trace, argv, match):
    assert_refused(capsys, tmp_path, ["events", trace, *argv], match)


def test_events_filter_matching_nothing_notes_it(capsys, trace):
    code, out, err = run_cli(capsys, "events", trace, "--seq", "999")
    assert code == 0 and out == ""
    assert err == "tracengine: note: no event matches --seq 999 (the trace has steps 0..2)\n"


# --- conventions -----------------------------------------------------------------------------------------

def test_help_describes_every_command_and_the_exit_codes():
    parser = build_parser()
    assert parser.description.endswith("stepped through.")
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        assert command.description, name
        assert "exit status:" in command.format_help() and "130" in command.format_help(), name
        for action in command._actions:
            assert action.help, f"{name} {action.dest} has no help"
    generate = sub.choices["generate"].format_help()
    assert "token budget of one prefill step (default 16384)" in generate
    assert "built-in mix: 16-token blocks, 48 blocks" in generate
    assert "3    check only: the trace is intact but has no end frame" in sub.choices["check"].format_help()


def test_block_size_is_one_name_everywhere(tmp_path, capsys, trace):
    for name in ("block_size", "block-size", "kvcache_block_size"):
        code, out, _ = run_cli(capsys, "replay", trace, "--set", f"{name}=8", "--arrivals", "steps", "--json")
        assert code == 0
        assert json.loads(out)["changes"] == [{"name": "kvcache_block_size", "old": 16, "new": 8}]
    new = tmp_path / "kv.trace"
    assert run_cli(capsys, "generate", *TINY, "--kvcache-block-size", "8", "--record", new)[0] == 0
    with TraceReader(new) as reader:
        assert reader.header.config["kvcache_block_size"] == 8


def test_progress_bar_goes_to_stderr(capsys):
    code, out, err = run_cli(capsys, "generate", "--prompt-lens", "5", "--max-tokens", "2")
    assert code == 0
    assert "Generating" in err and "Generating" not in out
    assert out.startswith("model ")


def test_generate_prints_completions_and_writes_outputs(tmp_path, capsys):
    out_file = tmp_path / "out.jsonl"
    code, out, _ = run_cli(capsys, "generate", "--quiet", "--prompt", "Hello", "--prompt", "The cache",
                           "--max-tokens", "4", "--temperature", "0", "--ignore-eos", "--output", out_file)
    assert code == 0
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["prompt"] for r in lines] == ["Hello", "The cache"]
    for i, r in enumerate(lines):
        assert set(r) == {"prompt", "text", "prompt_token_ids", "token_ids", "finish_reason", "ttft_s", "latency_s"}
        assert len(r["token_ids"]) == 4 and r["finish_reason"] == "length"
        assert 0 < r["ttft_s"] <= r["latency_s"]
        assert f"[{i}] {r['prompt']!r}\n    -> {r['text']!r} (4 tokens, length)" in out
    assert f"outputs      {out_file} (2 lines)" in out


def test_json_of_generate_check_replay_and_diff(tmp_path, capsys):
    path = tmp_path / "a.trace"
    code, out, _ = run_cli(capsys, "generate", *TINY, "--record", path, "--json")
    summary = json.loads(out)
    assert code == 0 and summary["stats"]["requests"]["num_requests"] == 3
    assert summary["stats"]["tokens"]["num_completion_tokens"] == 9                   # 3 x 3
    assert summary["trace_bytes"] == os.path.getsize(path) and summary["config"]["max_num_seqs"] == 512
    code, out, _ = run_cli(capsys, "check", path, "--json")
    checked = json.loads(out)
    assert code == 0 and checked["status"] == "whole" and checked["ended"] and checked["num_steps"] == 3
    code, out, _ = run_cli(capsys, "replay", path, "--json")
    replayed = json.loads(out)
    assert code == 0 and replayed["reproduced"] and replayed["divergence"] is None
    other = tmp_path / "b.trace"
    assert run_cli(capsys, "replay", path, "--set", "max_num_batched_tokens=20", "--arrivals", "steps", "--record", other)[0] == 0
    code, out, _ = run_cli(capsys, "diff", path, other, "--json")
    d = json.loads(out)
    assert code == 1 and not d["identical"] and d["step"] == 0
    assert d["config_changes"] == [{"name": "max_num_batched_tokens", "a": 16384, "b": 20}]
    assert d["a_event"] != d["b_event"] and d["b_stats"]["steps"]["num_steps"] > d["a_stats"]["steps"]["num_steps"]


# --- a Hugging Face id from the local cache --------------------------------------------------------------

def fake_hub_cache(root, model_id="Qwen/Qwen3-0.6B", revision="0123abcd"):
    snapshot = root / f"models--{model_id.replace('/', '--')}" / "snapshots" / revision
    shutil.copytree(EMBEDDED_MODEL_DIR, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(revision)
    return snapshot


def test_model_id_resolves_from_the_local_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = fake_hub_cache(tmp_path / "hf" / "hub")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "generate", "--model", "Qwen/Qwen3-0.6B", *TINY, "--json")
    assert code == 0 and json.loads(out)["model"] == str(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert_refused(capsys, tmp_path, ["generate", "--model", "Qwen/Qwen3-0.6B", *TINY],
                   "model 'Qwen/Qwen3-0.6B' is neither a directory nor in the Hugging Face cache")


def test_model_id_of_several_snapshots_without_ref_is_an_error(tmp_path, monkeypatch):
    from tracengine.model.loader import resolve_model_dir
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--m" / "snapshots"
    (repo / "a").mkdir(parents=True)
    (repo / "b").mkdir()
    with pytest.raises(ModelError, match="2 snapshots"):
        resolve_model_dir("org/m")
    (repo.parent / "refs").mkdir()
    (repo.parent / "refs" / "main").write_text("b\n")
    assert resolve_model_dir("org/m") == str(repo / "b")


# --- the Python API ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm():
    with LLM("", num_kvcache_blocks=64, kvcache_block_size=16) as llm:
        yield llm


def test_one_string_is_one_prompt_and_outputs_carry_it(llm):
    outputs = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert len(outputs) == 1 and outputs[0]["prompt"] == "Hello"
    ids = outputs[0]["prompt_token_ids"]
    again = llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert len(again) == 1 and again[0]["token_ids"] == outputs[0]["token_ids"]


PROMPTS = ["The scheduler decides which sequences run", "A prefix cache shares blocks"]


def tokens(llm, prompts, **sp):
    params = SamplingParams(max_tokens=12, ignore_eos=True, **sp)
    return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]


def test_top_k_1_and_a_tiny_top_p_are_greedy(llm):
    greedy = tokens(llm, PROMPTS, temperature=0.0)
    assert tokens(llm, PROMPTS, temperature=1.5, top_k=1) == greedy
    assert tokens(llm, PROMPTS, temperature=1.5, top_p=1e-6) == greedy
    assert tokens(llm, PROMPTS, temperature=1.5) != greedy      # the filters, not the temperature, did it


def test_a_request_seed_reproduces_in_any_batch(llm):
    alone = tokens(llm, PROMPTS[:1], temperature=1.0, seed=7)
    batched = tokens(llm, [PROMPTS[1], PROMPTS[0]], temperature=1.0, seed=7)[1]   # another seq_id
    assert alone[0] == batched
    assert tokens(llm, PROMPTS[:1], temperature=1.0, seed=8) != alone
    assert tokens(llm, PROMPTS[:1], temperature=1.0, top_k=5, top_p=0.9, seed=7) == \
        tokens(llm, PROMPTS[:1], temperature=1.0, top_k=5, top_p=0.9, seed=7)


@pytest.mark.parametrize("field, value", [("top_k", -2), ("top_p", 0.0), ("top_p", 1.5), ("seed", -2)])
def test_bad_sampling_params(field, value):
    from tracengine.errors import ConfigError
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_are_recorded_and_shown(tmp_path, capsys, llm):
    path = tmp_path / "sp.trace"
    llm.generate(PROMPTS, [SamplingParams(temperature=0.8, max_tokens=4, top_k=20, top_p=0.5, seed=11),
                           SamplingParams(temperature=0.0, max_tokens=4)], record=str(path), use_tqdm=False)
    code, out, _ = run_cli(capsys, "events", path, "--type", "RequestAdded", "--json")
    added = [json.loads(line) for line in out.splitlines()]
    assert [(e["top_k"], e["top_p"], e["seed"]) for e in added] == [(20, 0.5, 11), (-1, 1.0, -1)]
    code, out, _ = run_cli(capsys, "events", path, "--type", "RequestAdded")
    assert "top_k=20 top_p=0.5 seed=11" in out
    assert run_cli(capsys, "replay", path)[0] == 0


def test_outputs_of_calibrate_and_simulate_are_checked_too(tmp_path, capsys, trace):
    other = tmp_path / "other.json"
    other.write_text("keep me")
    assert_refused(capsys, tmp_path, ["calibrate", trace, "-o", other], "exists; give --force")
    assert_refused(capsys, tmp_path, ["calibrate", trace, "-o", trace, "--force"], "is the trace it reads")


def test_an_output_in_a_directory_that_does_not_exist_is_refused_before_the_run(tmp_path, capsys, trace):
    missing = tmp_path / "no" / "such"
    for argv in (["generate", *TINY, "--record", missing / "x.trace"],
                 ["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=32,64",
                  "--plot", missing / "p.png"],
                 ["export", trace, "--perfetto", missing / "x.json"]):
        assert_refused(capsys, tmp_path, argv, f"there is no directory '{missing}'")


def test_a_goodput_plot_without_an_objective_is_refused(tmp_path, capsys, trace):
    assert_refused(capsys, tmp_path, ["simulate", "--num-prompts", "3", "--roofline", EMBEDDED_MODEL_DIR,
                                      "--hardware", "H100", "--set", "num_kvcache_blocks=64",
                                      "--sweep", "max_num_seqs=1,2", "--plot", tmp_path / "p.png",
                                      "--plot-figure", "goodput"], "needs an --slo")
    # a step-exact sweep has no goodput at all (objectives are times; its figures are in steps)
    assert_refused(capsys, tmp_path, ["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=32,64",
                                      "--plot", tmp_path / "p.png", "--plot-figure", "goodput"], "is one of")


def test_replay_json_of_a_timed_what_if_on_a_short_trace_is_refused_not_switched(tmp_path, capsys, trace):
    # the trace has arrival times, so a what-if (JSON or not) runs in simulated time by default,
    # and 3 steps are too few to calibrate on (tests/test_steptime.py has the JSON itself)
    assert_refused(capsys, tmp_path, ["replay", trace, "--set", "num_kvcache_blocks=32", "--json"],
                   "calibration needs at least 10: give --step-time or --roofline, or --arrivals steps")


# --- output into a closed pipe ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["check"], ["stats"], ["stats", "--json"], ["replay"], ["diff", "--json"],
                                     ["events"], ["events", "--json"], ["render"]])
def test_a_closed_output_pipe_ends_quietly(trace, command):
    """`tracengine diff a b | head -1`: the reader went away, which is no error of the trace, and the
    command did not finish, so it claims neither success (0) nor a failed check (1): 141, as a shell says."""
    if command[0] == "diff":
        command = [*command, str(trace)]
    import subprocess
    import sys
    read_end, write_end = os.pipe()
    os.close(read_end)                 # every write fails with EPIPE, whatever the timing
    try:
        result = subprocess.run([sys.executable, "-m", "tracengine.cli", *command, str(trace)],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def test_a_closed_output_pipe_ends_simulate_quietly_too(tmp_path):
    """simulate prints its stats table through rich, which on its own exits 1 on a closed pipe."""
    import subprocess
    import sys
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "intermediate_size": 128, "vocab_size": 1000}))
    # the reader takes the first line and goes (`| head -1`): the table after it meets the closed pipe
    p = subprocess.Popen([sys.executable, "-m", "tracengine.cli", "simulate", "--num-prompts", "3",
                          "--roofline", str(config), "--hardware", "H100", "--set", "num_kvcache_blocks=100",
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("simulated 3 requests")
    p.stdout.close()
    assert p.wait(timeout=120) == 141
    with p.stderr:
        assert p.stderr.read() == ""


@pytest.mark.parametrize("command", [["check"], ["events"], ["stats"], ["render"], ["replay"],
                                     ["export", "--perfetto", "out.json"]])
def test_a_directory_given_as_a_trace_is_named(tmp_path, capsys, command):
    directory = tmp_path / "adir"
    directory.mkdir()
    assert main([command[0], str(directory), *command[1:]]) == 2
    assert capsys.readouterr().err == f"tracengine: error: {directory} is a directory, not a trace\n"
