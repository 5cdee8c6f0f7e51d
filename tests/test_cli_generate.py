"""`tracengine generate`: workloads, and bad input as one line and exit 2."""
import json

import pytest

from tracengine.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, match):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracengine: error: "), err
    assert match in lines[0]


def test_prompt_lens_workload_records_the_seed_example(tmp_path, capsys):
    trace = tmp_path / "seed.trace"
    code, out, _ = run_cli(capsys, "generate", "--prompt-lens", "25,8,6", "--max-num-batched-tokens", "20",
                           "--max-tokens", "4", "--ignore-eos", "--temperature", "0", "--quiet",
                           "--record", str(trace))
    assert code == 0
    assert "requests     3 (0 eos, 3 length)" in out
    assert "tokens       39 prompt, 12 generated" in out      # 25 + 8 + 6 = 39; 3 x 4 = 12
    code, out, _ = run_cli(capsys, "events", str(trace), "--json", "--type", "ScheduleDecision", "--step", "0:2")
    first, second = [json.loads(line) for line in out.splitlines()]
    assert [(s["seq_id"], s["num_tokens"]) for s in first["seqs"]] == [(0, 20)]
    assert [(s["seq_id"], s["num_tokens"]) for s in second["seqs"]] == [(0, 5), (1, 8), (2, 6)]


def test_prompts_file_text_and_jsonl(tmp_path, capsys):
    text = tmp_path / "prompts.txt"
    text.write_text("The scheduler decides\n\nA prefix cache\n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": "The scheduler decides"}) + "\n")
    for path, count in ((text, 2), (jsonl, 1)):
        code, out, _ = run_cli(capsys, "generate", "--prompts-file", str(path), "--max-tokens", "3", "--quiet")
        assert code == 0 and f"requests     {count} " in out


def test_synthetic_workload(capsys):
    code, out, _ = run_cli(capsys, "generate", "--num-prompts", "3", "--input-len", "8:16", "--output-len", "2:4",
                           "--quiet")
    assert code == 0 and "requests     3 (0 eos, 3 length)" in out


@pytest.mark.parametrize("argv, match", [
    (["--model", "no/such/dir"], "no/such/dir"),
    (["--num-kvcache-blocks", "0"], "num_kvcache_blocks must be a positive integer or -1 (as many as fit), got 0"),
    (["--max-model-len", "16", "--prompt-lens", "40"], "longer than max_model_len=16"),
    (["--num-kvcache-blocks", "2", "--prompt-lens", "40"], "the cache has 2"),
    (["--num-prompts", "2", "--input-len", "9:3"], "--input-len expects 0 < MIN <= MAX"),
    (["--prompts-file", "missing.txt"], "missing.txt"),
    (["--prompt", "a", "--prompt-lens", "3"], "choose one of"),
    (["--temperature", "-1", "--prompt", "a"], "temperature must be >= 0"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, match):
    code, _, err = run_cli(capsys, "generate", "--quiet", *argv)
    assert_one_line_error(code, err, match)


def test_malformed_config_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "generate", "--quiet", "--model", str(tmp_path))
    assert_one_line_error(code, err, "config.json")


def test_a_refused_workload_writes_nothing(tmp_path, capsys):
    trace = tmp_path / "old.trace"
    trace.write_bytes(b"an older trace")
    # validation fails after the model loaded: even with --force the old file stays as it was
    code, _, err = run_cli(capsys, "generate", "--quiet", "--force", "--record", str(trace), "--prompt-lens", "4,4000",
                           "--max-model-len", "64")
    assert_one_line_error(code, err, "longer than max_model_len=64")
    assert trace.read_bytes() == b"an older trace"
    fresh = tmp_path / "fresh.trace"
    code, _, err = run_cli(capsys, "generate", "--quiet", "--record", str(fresh), "--prompt-lens", "5000")
    assert_one_line_error(code, err, "longer than max_model_len")
    assert not fresh.exists()


def test_a_kv_cache_larger_than_memory_is_refused_with_the_figures(tmp_path, capsys, monkeypatch):
    """Checked before the allocator fails on it (a traceback) or the kernel kills the process."""
    trace = tmp_path / "old.trace"
    trace.write_bytes(b"an older trace")
    code, _, err = run_cli(capsys, "generate", "--quiet", "--prompt-lens", "8", "--num-kvcache-blocks", str(10**12),
                           "--record", str(trace), "--force")
    assert_one_line_error(code, err, "num_kvcache_blocks=1000000000000 needs 32,768,000,000,032,768 bytes for the "
                                     "KV cache (32,768,000.0 GB, 32,768 a block), but ")
    assert trace.read_bytes() == b"an older trace"
    import tracengine.runner.model_runner as model_runner
    monkeypatch.setattr(model_runner, "available_memory", lambda device: (10 * 32768 + 5, "MemAvailable"))
    code, _, err = run_cli(capsys, "generate", "--quiet", "--prompt-lens", "8", "--num-kvcache-blocks", "100")
    assert code == 2 and err == ("tracengine: error: num_kvcache_blocks=100 needs 3,309,568 bytes for the KV cache "
                                 "(0.0 GB, 32,768 a block), but 327,685 bytes (0.0 GB) are available (MemAvailable): "
                                 "9 blocks fit\n")
    code, out, _ = run_cli(capsys, "generate", "--quiet", "--prompt-lens", "8", "--num-kvcache-blocks", "9")
    assert code == 0 and "9 KV blocks" in out


def test_serve_refuses_a_kv_cache_larger_than_memory_before_it_listens():
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "tracengine.cli", "serve", "--port", "0", "--num-kvcache-blocks",
                             str(10**12)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("tracengine: error: num_kvcache_blocks=1000000000000 needs ") \
        and result.stderr.count("\n") == 1
