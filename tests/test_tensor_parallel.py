"""Tensor parallelism on the CPU (gloo), on the embedded model (4 attention
heads, 2 KV heads): two ranks compute what one does, record the same
scheduling, and fail cleanly when a worker dies."""
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tracengine import LLM, SamplingParams
from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.errors import ConfigError, WorkerError
from tracengine.trace.events import TraceHeader
from tracengine.trace.views import without_wall_clock
from tracengine.model.linear import QKVParallelLinear
from tracengine.model.loader import load_hf_config, resolve_model_dir
from tracengine.runner import make_runner
from tracengine.runner.device import cpu_threads_per_rank
from tracengine.runner.model_runner import ModelRunner
from tracengine.runner.tp_check import check_tensor_parallel
from tracengine.engine.sequence import Sequence
from tracengine.trace.tracelog import open_trace

ENGINE = dict(kvcache_block_size=4, num_kvcache_blocks=64, max_num_batched_tokens=32)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def embedded_hf_config():
    return load_hf_config(resolve_model_dir(""))


@pytest.fixture(scope="module")
def two_ranks():
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        llm = LLM("", tensor_parallel_size=2, **ENGINE)
        # On the CPU rank 0 takes its share of the cores while the group lives, as the worker does.
        assert torch.get_num_threads() == cpu_threads_per_rank(2)
        procs = list(llm.runner.tp.procs)
        yield llm
        llm.close()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
    # Closing the engine ends its workers and its process group.
    assert all(proc.exitcode == 0 for proc in procs)


def _seqs(lengths: list[int]) -> list[Sequence]:
    """Prompts of random ids, each with its own blocks (room for one more token)."""
    generator = torch.Generator().manual_seed(0)
    seqs, next_block = [], 0
    for seq_id, n in enumerate(lengths):
        seq = Sequence(seq_id, torch.randint(0, 1024, (n,), generator=generator).tolist(), 4)
        num_blocks = n // 4 + 1
        seq.block_table = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        seq.num_scheduled_tokens = n
        seqs.append(seq)
    return seqs


def _prefill_then_decode(runner) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = _seqs([13, 7, 21])
    prefill = runner.compute_logits(seqs, True)
    for seq, token_id in zip(seqs, prefill.argmax(-1).tolist()):
        seq.num_cached_tokens = seq.num_tokens
        seq.append_token(token_id)
        seq.num_scheduled_tokens = 1
    return prefill, runner.compute_logits(seqs, False)


# --- the same numbers and the same tokens as one rank ----------------------

def test_logits_match_one_rank(two_ranks):
    one = ModelRunner(Config(**ENGINE))
    expected = _prefill_then_decode(one)
    one.exit()
    actual = _prefill_then_decode(two_ranks.runner)
    for e, a in zip(expected, actual):   # prefill: [3, 1024] at each prompt's last token; then one decode
        assert e.shape == a.shape == (3, 1024)
        torch.testing.assert_close(a, e, atol=1e-4, rtol=0)


def test_each_rank_holds_its_shard(two_ranks):
    layer = two_ranks.runner.model.model.layers[0]
    # 4 heads x 32 and 2 KV heads x 32 split in two: rank 0 holds q heads 0-1 and KV head 0.
    assert layer.self_attn.qkv_proj.weight.shape == ((2 + 1 + 1) * 32, 128)
    assert layer.mlp.down_proj.weight.shape == (128, 256 // 2)
    assert two_ranks.runner.model.lm_head.weight.shape == (1024 // 2, 128)
    attn = layer.self_attn.attn
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)   # and the cache holds one KV head per rank


def test_kv_heads_replicate_over_more_ranks_than_kv_heads():
    full_q, full_k, full_v = torch.randn(4 * 8, 16), torch.randn(2 * 8, 16), torch.randn(2 * 8, 16)
    for rank in range(4):   # 4 heads, 2 KV heads, 4 ranks: ranks 0-1 share KV head 0, ranks 2-3 KV head 1
        qkv = QKVParallelLinear(16, 8, 4, 2, tp_rank=rank, tp_size=4)
        for shard_id, full in (("q", full_q), ("k", full_k), ("v", full_v)):
            qkv.weight.weight_loader(qkv.weight, full, shard_id)
        kv = slice(rank // 2 * 8, rank // 2 * 8 + 8)
        assert torch.equal(qkv.weight.data, torch.cat([full_q[rank * 8:rank * 8 + 8], full_k[kv], full_v[kv]]))


# --- the trace: the layout in the header, the scheduling unchanged ---------

def _record(path, tp_size: int):
    # 16 blocks x 4 = 64 slots for 4 prompts of 97 tokens and their outputs:
    # chunked prefill, head-of-line blocking and preemption all happen.
    argv = ["generate", "--quiet", "--record", str(path), "--prompt-lens", "30,25,22,20", "--temperature", "0",
            "--max-tokens", "10", "--ignore-eos", "--block-size", "4", "--num-kvcache-blocks", "16",
            "--max-num-batched-tokens", "24", "--tensor-parallel-size", str(tp_size)]
    assert main(argv) == 0
    events = list(open_trace(str(path)))
    return events[0], events[1:]


def test_two_ranks_record_the_same_trace_and_it_replays(tmp_path, capsys):
    header_1, events_1 = _record(tmp_path / "one.trace", 1)
    header_2, events_2 = _record(tmp_path / "two.trace", 2)
    assert isinstance(header_2, TraceHeader)
    assert (header_1.tensor_parallel_size, header_2.tensor_parallel_size) == (1, 2)
    assert header_2.config["tensor_parallel_size"] == 2
    assert {k: v for k, v in header_2.config.items() if k != "tensor_parallel_size"} == \
        {k: v for k, v in header_1.config.items() if k != "tensor_parallel_size"}
    assert {type(e).__name__ for e in events_2} >= {"Preempt", "TokenSample", "SeqFinish"}
    # Every event, sampled greedy tokens included, is the same but for wall-clock fields.
    assert [without_wall_clock(e) for e in events_2] == [without_wall_clock(e) for e in events_1]
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "two.trace")]) == 0
    assert main(["diff", str(tmp_path / "one.trace"), str(tmp_path / "two.trace")]) == 0


# --- failures: clear errors, no hung or orphan process ----------------------

def test_a_killed_worker_raises_worker_error():
    llm = LLM("", tensor_parallel_size=2, **ENGINE)
    tp = llm.runner.tp
    [worker] = tp.procs

    stop = threading.Event()

    def kill_mid_run():
        while llm.num_steps < 3 and not stop.is_set():
            time.sleep(0.001)
        os.kill(worker.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_run, daemon=True)
    killer.start()
    sp = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)   # 15 + 200 tokens: 54 of 64 blocks
    try:
        with pytest.raises(WorkerError, match=rf"rank 1 \(pid {worker.pid}\) was killed by SIGKILL during step \d+"):
            llm.generate(["a long run that the kill interrupts"] * 2, sp, use_tqdm=False)
    finally:
        stop.set()
        killer.join()
    with pytest.raises(WorkerError, match="SIGKILL"):   # the engine stays failed
        llm.step()
    llm.close()
    assert worker.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("plan", ["none", "groups", "copies"])
def test_the_wire_carries_every_context_field_and_cpu_plan(plan):
    from tracengine.model.context import Context
    from tracengine.runner.torch_plans import KVCopyPlan, PrefillGroups
    from tracengine.runner.tp_wire import decode_step, encode_step, is_exit
    context = Context(plan != "copies", torch.tensor([0, 3, 5], dtype=torch.int32), None, 3, 9,
                      torch.arange(5), torch.tensor([9, 4], dtype=torch.int32), torch.tensor([[1, 2], [3, 0]],
                                                                                             dtype=torch.int32))
    context.cpu_plan = {"none": None,
                        "groups": PrefillGroups(torch.tensor([1, 0]), torch.tensor([[0, 2, 3, 9, 5]])),
                        "copies": KVCopyPlan(48, True, torch.tensor([1, 0]), torch.tensor([9, 4], dtype=torch.int32),
                                             torch.tensor([[0, 2, 9]]))}[plan]
    header, payload = encode_step(torch.tensor([7, 8]), torch.tensor([[5], [6]]), context)
    assert not is_exit(header)

    class Loopback:   # rank 0's broadcast, as a worker receives it
        device = torch.device("cpu")

        def broadcast(self, t):
            t.copy_(payload)

    input_ids, positions, received = decode_step(header, Loopback())
    assert input_ids.tolist() == [7, 8] and positions.tolist() == [[5], [6]]

    def assert_same(sent, got):
        for field in dataclasses.fields(sent):
            a, b = getattr(sent, field.name), getattr(got, field.name)
            if isinstance(a, torch.Tensor):
                assert b.dtype == a.dtype and torch.equal(b, a), field.name
            elif field.name == "cpu_plan":
                assert type(b) is type(a)
                if a is not None:
                    assert_same(a, b)
            else:
                assert b == a and type(b) is type(a), field.name

    assert_same(context, received)


def test_a_hello_read_while_checking_for_failures_is_not_lost():
    """The pipes have one reader: a hello that arrives while rank 0 checks the
    workers for failures still counts, so start-up does not wait for it forever."""
    import multiprocessing
    import types
    from tracengine.runner.tp_group import TensorParallelGroup
    group = TensorParallelGroup.__new__(TensorParallelGroup)
    parent, child = multiprocessing.Pipe()
    group.procs, group.conns, group.said_hello = [types.SimpleNamespace(pid=1, exitcode=None)], [parent], set()
    child.send(("hello",))
    assert group._failures() == "" and group.said_hello == {0}
    start = time.monotonic()
    group._wait_for_hello()
    assert time.monotonic() - start < 1
    child.send(("error", "ValueError: bad"))
    assert group._failures() == "tensor-parallel worker rank 1 (pid 1) failed: ValueError: bad"
    parent.close()
    child.close()


def test_a_worker_dying_before_the_group_forms_is_an_error_at_once(monkeypatch):
    from tracengine.runner.tp_group import TensorParallelGroup
    wait_for_hello = TensorParallelGroup._wait_for_hello

    def hello_then_kill(self):
        wait_for_hello(self)
        os.kill(self.procs[0].pid, signal.SIGKILL)   # said hello, will never join

    monkeypatch.setattr(TensorParallelGroup, "_wait_for_hello", hello_then_kill)
    start = time.monotonic()
    # Usually while rank 0 waits in the rendezvous; a worker quick enough to join first is found just after.
    with pytest.raises(WorkerError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL (while the ranks formed|during)"):
        LLM("", tensor_parallel_size=2, **ENGINE)
    assert time.monotonic() - start < 60   # not the collective timeout (120 s)


def test_a_worker_that_raises_reports_its_exception(capfd):
    llm = LLM("", tensor_parallel_size=2, **ENGINE)
    [worker] = llm.runner.tp.procs
    llm.runner.tp.conns[0].send_bytes(b"garbage")   # a header the worker cannot decode: it raises
    with pytest.raises(WorkerError, match=r"rank 1 \(pid \d+\) failed: ValueError: .* during step 0"):
        llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    llm.close()
    assert worker.exitcode == 1
    assert "ValueError" in capfd.readouterr().err   # the worker's traceback, on the shared stderr


# The engine's process starts two ranks and is killed; a plain-attribute
# model config spares it the transformers import (seconds).
WORKER_PIDS_THEN_DIE = """
import json, os, signal, sys, types
from tracengine.engine.config import Config
from tracengine.model.loader import resolve_model_dir
from tracengine.runner import make_runner
if __name__ == "__main__":
    with open(os.path.join(resolve_model_dir(""), "config.json")) as f:
        hf_config = types.SimpleNamespace(**json.load(f))
    runner = make_runner(Config(tensor_parallel_size=2, kvcache_block_size=4, num_kvcache_blocks=16), hf_config)
    print(*[proc.pid for proc in runner.tp.procs], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_engine_process_dies(tmp_path, two_ranks):
    # Runs while this process holds a two-rank engine too: no shared port or name.
    script = tmp_path / "engine.py"
    script.write_text(WORKER_PIDS_THEN_DIE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    [worker_pid] = [int(pid) for pid in proc.stdout.split()]
    deadline = time.monotonic() + 30   # the orphan sees its pipe close (or polls for its parent)
    while _is_running(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _is_running(worker_pid)


# --- config validation: one line, before any process starts ----------------

@pytest.mark.parametrize("changes, size, message", [
    ({}, 3, "tensor_parallel_size=3 does not divide the model's 4 attention heads"),
    (dict(num_attention_heads=6, num_key_value_heads=2), 3, "and the model's 2 KV heads divide neither way"),
    (dict(intermediate_size=250), 4, "does not divide the model's intermediate_size 250"),
    (dict(vocab_size=1022), 4, "does not divide the model's vocab_size 1022"),
])
def test_layouts_the_model_cannot_split(embedded_hf_config, changes, size, message):
    hf_config = embedded_hf_config.__class__.from_dict({**embedded_hf_config.to_dict(), **changes})
    with pytest.raises(ConfigError, match=message):
        make_runner(Config(tensor_parallel_size=size, num_kvcache_blocks=8), hf_config)


def test_more_ranks_than_cuda_devices(embedded_hf_config):
    with pytest.raises(ConfigError, match=r"needs CUDA devices 1\.\.2, but \d+ exist"):
        check_tensor_parallel(Config(tensor_parallel_size=2), embedded_hf_config, torch.device("cuda", 1))


def test_cli_reports_a_layout_error_in_one_line(capsys):
    assert main(["generate", "--quiet", "--prompt-lens", "5", "--tensor-parallel-size", "3"]) == 2
    err = capsys.readouterr().err
    assert err == "tracengine: error: tensor_parallel_size=3 does not divide the model's 4 attention heads\n"
