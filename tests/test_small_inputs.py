"""Small input fixes (issue 34, item 12): a workload or prompts file that starts with a
UTF-8 byte-order mark reads as the same file without it; `--num-kvcache-blocks -1` is
"as many as fit", said in the help and in the refusal of any other number below 1."""
import codecs

import pytest

from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.errors import ConfigError
from tracengine.workload.formats import read_workload
from tracengine.workload.sources import read_prompts_file

SAMPLES = {
    "mooncake": '{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0]}\n'
                '{"timestamp": 500, "input_length": 8, "output_length": 2, "hash_ids": [0]}\n',
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
             "2024-03-02 09:00:00.0000000,12,3\n2024-03-02 09:00:00.2500000,9,2\n",
    "tracengine": '{"arrival_s": 0, "prompt_token_ids": [5, 6, 7], "max_tokens": 2}\n'
                  '{"arrival_s": 0.5, "prompt_token_ids": [8, 9], "max_tokens": 3}\n',
}


@pytest.mark.parametrize("format", sorted(SAMPLES))
def test_a_workload_file_with_a_byte_order_mark_reads(tmp_path, format):
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.write_text(SAMPLES[format], encoding="utf-8")
    marked.write_bytes(codecs.BOM_UTF8 + SAMPLES[format].encode())
    expected = read_workload(str(plain), vocab_size=1000)
    for named in (None, format):       # detected from the file, and named
        got = read_workload(str(marked), named, vocab_size=1000)
        assert [(r.arrival_ns, len(r.prompt), r.max_tokens) for r in got] == \
            [(r.arrival_ns, len(r.prompt), r.max_tokens) for r in expected]


def test_a_prompts_file_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"Hello\nWhy is the sky blue?\n")
    assert read_prompts_file(str(path)) == ["Hello", "Why is the sky blue?"]


def test_minus_one_kv_blocks_is_auto_and_the_help_says_so(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")     # argparse wraps the help to the terminal
    assert Config(num_kvcache_blocks=-1).num_kvcache_blocks == -1
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--num-kvcache-blocks N KV cache blocks (-1: as many as --gpu-memory-utilization allows;" in help_text


@pytest.mark.parametrize("value", [0, -5])
def test_other_numbers_below_one_are_refused_naming_minus_one(value):
    with pytest.raises(ConfigError, match=rf"num_kvcache_blocks must be a positive integer or -1 \(as many as "
                                          rf"fit\), got {value}"):
        Config(num_kvcache_blocks=value)
