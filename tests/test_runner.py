"""The model runner on the embedded model, with sequences and block tables
built by hand (no scheduler): every way of reaching a token — one prefill,
chunks, a cached prefix, decode, a batch, the CUDA-graph buckets — must give
the logits of a plain full forward, and sampling must not depend on the batch."""
import itertools
import os
import py_compile
import subprocess
import sys

import pytest
import torch

from tracengine.engine.config import Config
from tracengine.errors import ConfigError
from tracengine.model.context import get_context
from tracengine.runner.cuda_graph import graph_batch_sizes
from tracengine.runner.model_runner import ModelRunner
from tracengine.runner.sampler import CDF_CHUNK, Sampler, inverse_cdf, sample_seed
from tracengine.runner.torch_plans import KV_COPY_BUCKET_ROWS, KV_COPY_BUCKETS, KVCopies, plan_prefill_groups
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.sequence import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = 1e-4
NUM_BLOCKS = 96


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_runner(block_size: int, **overrides) -> ModelRunner:
    values = dict(kvcache_block_size=block_size, num_kvcache_blocks=NUM_BLOCKS, max_model_len=256, max_num_seqs=8)
    values.update(overrides)
    use_cuda_graph = values.pop("use_cuda_graph", None)
    return ModelRunner(Config(**values), use_cuda_graph=use_cuda_graph)


@pytest.fixture(scope="module", params=[4, 16], ids=["block4", "block16"])
def runner(request):
    runner = make_runner(request.param)
    yield runner
    runner.exit()


class Blocks:
    """Hands out block ids in order; each test starts from block 0 (stale cache contents are never read)."""

    def __init__(self, runner: ModelRunner):
        self.block_size = runner.block_size
        self.num_blocks = runner.num_kvcache_blocks
        self.next_id = 0

    def take(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // self.block_size)
        self.next_id += n
        assert self.next_id <= self.num_blocks
        return list(range(self.next_id - n, self.next_id))


def tokens(n: int, salt: int = 0) -> list[int]:
    """Deterministic ids spread over the vocabulary (avoiding 0, the eos)."""
    return [1 + (7 * i + 131 * salt) % 1000 for i in range(n)]


def new_seq(runner, seq_id, token_ids, block_table, temperature=0.0) -> Sequence:
    seq = Sequence(seq_id, token_ids, runner.block_size, SamplingParams(temperature=temperature))
    seq.block_table = block_table
    return seq


def schedule(seq: Sequence, num_tokens: int | None = None) -> Sequence:
    """Prefill the next `num_tokens` (default: all uncached) tokens of seq."""
    seq.num_scheduled_tokens = num_tokens if num_tokens is not None else seq.num_tokens - seq.num_cached_tokens
    return seq


def computed(seqs):
    for seq in seqs:
        seq.num_cached_tokens += seq.num_scheduled_tokens


@torch.inference_mode()
def reference_logits(runner, token_ids) -> torch.Tensor:
    """Next-token logits of a plain forward over the whole sequence: no cache, no context."""
    model = runner.model
    return model.compute_logits(model(torch.tensor(token_ids), torch.arange(len(token_ids))))[-1]


def test_prefill_in_one_go(runner):
    blocks = Blocks(runner)
    ids = tokens(37)
    seq = schedule(new_seq(runner, 0, ids, blocks.take(37)))
    logits = runner.compute_logits([seq], True)
    assert logits.shape == (1, runner.hf_config.vocab_size)
    torch.testing.assert_close(logits[0], reference_logits(runner, ids), atol=ATOL, rtol=0)
    assert get_context() is None   # the forward context does not outlive the forward


@pytest.mark.parametrize("chunks", [[7, 5, 13, 12], [1, 36], [16, 16, 5]])
def test_chunked_prefill_matches_full_forward(runner, chunks):
    blocks = Blocks(runner)
    ids = tokens(sum(chunks), salt=1)
    seq = new_seq(runner, 0, ids, blocks.take(len(ids)))
    for chunk in chunks:
        end = seq.num_cached_tokens + chunk
        logits = runner.compute_logits([schedule(seq, chunk)], True)
        # Each chunk's last row is the next-token logits of the prefix so far.
        torch.testing.assert_close(logits[0], reference_logits(runner, ids[:end]), atol=ATOL, rtol=0)
        computed([seq])


def test_prefix_cache_hit_matches_full_forward(runner):
    blocks = Blocks(runner)
    bs = runner.block_size
    shared = tokens(2 * 16, salt=2)            # two full blocks of 16, eight of 4
    first = new_seq(runner, 0, shared + tokens(9, salt=3), blocks.take(41))
    runner.run([schedule(first)], True)
    computed([first])
    # The second sequence reuses the first's full prefix blocks and computes only its own tail,
    # in one batch with a sequence that has no cached prefix.
    num_shared_blocks = len(shared) // bs
    second_ids = shared + tokens(11, salt=4)
    second = new_seq(runner, 1, second_ids, first.block_table[:num_shared_blocks] + blocks.take(11))
    second.num_cached_tokens = len(shared)
    third_ids = tokens(20, salt=5)
    third = new_seq(runner, 2, third_ids, blocks.take(20))
    logits = runner.compute_logits([schedule(second), schedule(third)], True)
    torch.testing.assert_close(logits[0], reference_logits(runner, second_ids), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], reference_logits(runner, third_ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("num_pairs", [1, 4], ids=["one-grid", "length-groups"])
def test_decodes_in_a_prefill_batch_match_decoding_alone(num_pairs):
    """A general batch (is_prefill=True) may hold sequences that decode (their
    last token, every earlier one cached) beside chunks and new prompts: each
    row is the plain full forward's, and the greedy tokens are those of the
    decoding sequences run alone. 4 pairs: 8 sequences up to 90 tokens, so on
    the CPU they attend in length groups."""
    runner = make_runner(4, num_kvcache_blocks=400, max_num_seqs=16)
    try:
        blocks = Blocks(runner)
        prompts = [tokens(n, salt=80 + n) for n in (9, 70, 30, 52)[:num_pairs]]
        alone = generate(runner, blocks, prompts, 6, 0.0, list(range(num_pairs)))
        decoding = [new_seq(runner, i, ids, blocks.take(len(ids) + 6)) for i, ids in enumerate(prompts)]
        for seq, token_id in zip(decoding, runner.run([schedule(seq) for seq in decoding], True)):
            seq.append_token(token_id)
        computed(decoding)
        lengths = (40, 90, 17, 66)[:num_pairs]
        others = [new_seq(runner, 100 + i, tokens(n, salt=90 + i), blocks.take(n)) for i, n in enumerate(lengths)]
        for step in range(5):
            # Beside the decodes: the others' first halves, then their rest (a cached prefix), then new prompts.
            chunks = [n // 2 for n in lengths] if step == 0 else [None] * num_pairs
            if step >= 2:
                others = [new_seq(runner, 10 * step + i, tokens(11 + i, salt=step + i), blocks.take(11 + i))
                          for i in range(num_pairs)]
            batch = [schedule(seq, 1) for seq in decoding] + [schedule(seq, n) for seq, n in zip(others, chunks)]
            cu_q = list(itertools.accumulate((seq.num_scheduled_tokens for seq in batch), initial=0))
            cu_k = list(itertools.accumulate((seq.num_cached_tokens + seq.num_scheduled_tokens for seq in batch),
                                             initial=0))
            assert (plan_prefill_groups(cu_q, cu_k) is not None) == (num_pairs == 4)
            logits = runner.compute_logits(batch, True)
            for seq, row in zip(batch, logits):
                torch.testing.assert_close(row, reference_logits(runner, seq.token_ids[:seq.num_cached_tokens
                                                                                   + seq.num_scheduled_tokens]),
                                           atol=ATOL, rtol=0)
            computed(batch)
            for seq, row in zip(decoding, logits):
                seq.append_token(int(row.argmax()))
        assert [seq.completion_token_ids for seq in decoding] == alone
    finally:
        runner.exit()


def test_decode_matches_full_recompute(runner):
    blocks = Blocks(runner)
    lengths = [3, 17, 30]                      # decode steps cross block boundaries at both sizes
    seqs = [new_seq(runner, i, tokens(n, salt=i), blocks.take(n + 12)) for i, n in enumerate(lengths)]
    for seq, token_id in zip(seqs, runner.run([schedule(seq) for seq in seqs], True)):
        seq.append_token(token_id)
    computed(seqs)
    for _ in range(10):
        logits = runner.compute_logits(seqs, False)
        for seq, row in zip(seqs, logits):
            torch.testing.assert_close(row, reference_logits(runner, seq.token_ids), atol=ATOL, rtol=0)
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(int(row.argmax()))


def test_decode_across_batch_changes_matches_full_recompute(runner):
    """On the CPU, decode keeps dense copies of the batch's keys while the batch
    stays the same; a sequence sitting out, a new order or a return refills them."""
    blocks = Blocks(runner)
    seqs = [new_seq(runner, i, tokens(n, salt=20 + i), blocks.take(n + 16)) for i, n in enumerate([5, 18, 11])]
    for seq, token_id in zip(seqs, runner.run([schedule(seq) for seq in seqs], True)):
        seq.append_token(token_id)
    computed(seqs)
    a, b, c = seqs
    for batch in ([a, b, c], [a, b, c], [a, c], [a, c], [c, a], [c, a], [a, b, c], [a, b, c], [a, b, c]):
        logits = runner.compute_logits(batch, False)
        for seq, row in zip(batch, logits):
            torch.testing.assert_close(row, reference_logits(runner, seq.token_ids), atol=ATOL, rtol=0)
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(int(row.argmax()))


def test_verify_on_the_decode_copies_matches_full_recompute(runner):
    """A decode step that verifies drafts runs over the dense copies, each sequence with 1 + its
    drafts queries: the logits at every position are a full recompute's, whether the drafts were
    kept (a) or rejected (b, whose rejected keys the next step writes over), beside a sequence
    without drafts (c), and the copies are reused from step to step."""
    blocks = Blocks(runner)
    seqs = [new_seq(runner, i, tokens(n, salt=40 + i), blocks.take(n + 40)) for i, n in enumerate([6, 19, 12])]
    for seq, token_id in zip(seqs, runner.run([schedule(seq) for seq in seqs], True)):
        seq.append_token(token_id)
    computed(seqs)

    def greedy(token_ids, n):
        out = []
        for _ in range(n):
            out.append(int(reference_logits(runner, token_ids + out).argmax()))
        return out

    a, b, c = seqs
    for step in range(6):
        a.spec_token_ids = greedy(a.token_ids, 2 + step % 2)          # kept
        b.spec_token_ids = [t + 1 for t in greedy(b.token_ids, 3)]    # rejected
        c.spec_token_ids = []
        inputs = runner.prepare_verify(seqs)
        assert inputs is not None and (step == 0 or runner.kv_copy_planner.last.reuse)
        with torch.inference_mode():
            logits = runner.run_model(*inputs)
        row = 0
        for seq in seqs:
            drafts = seq.spec_token_ids
            for i in range(len(drafts) + 1):
                torch.testing.assert_close(logits[row], reference_logits(runner, seq.token_ids + drafts[:i]),
                                           atol=ATOL, rtol=0)
                row += 1
            kept = [int(logits[row - len(drafts) - 1 + i].argmax()) for i in range(len(drafts) + 1)]
            num_accepted = next((i for i, d in enumerate(drafts) if d != kept[i]), len(drafts))
            seq.num_cached_tokens = seq.num_tokens + num_accepted
            for token_id in kept[:num_accepted + 1]:
                seq.append_token(token_id)
            seq.spec_token_ids = []
        assert row == logits.size(0)


@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_in_length_groups_matches_full_forward(block_size):
    """12 sequences of 5-150 tokens: on the CPU they attend in grids of similar
    length, with and without a cached prefix (an earlier chunk of each)."""
    runner = make_runner(block_size, num_kvcache_blocks=700 // block_size * 4, max_num_seqs=16)
    try:
        lengths = [5, 150, 33, 90, 12, 71, 128, 48, 7, 101, 64, 19]
        seqs, next_block = [], 0
        for i, n in enumerate(lengths):
            num_blocks = -(-n // block_size)
            seqs.append(new_seq(runner, i, tokens(n, salt=60 + i), list(range(next_block, next_block + num_blocks))))
            next_block += num_blocks
        first_chunks = [max(1, n // 3) for n in lengths]
        for with_prefix in (False, True):
            for seq, chunk in zip(seqs, first_chunks):
                seq.num_cached_tokens = chunk if with_prefix else 0
            batch = [schedule(seq) for seq in seqs]
            cu_q, cu_k = [0], [0]
            for seq in batch:
                cu_q.append(cu_q[-1] + seq.num_scheduled_tokens)
                cu_k.append(cu_k[-1] + seq.num_tokens)
            order, groups = plan_prefill_groups(cu_q, cu_k)
            assert len(groups) == 3 and sorted(order) == list(range(12))
            if with_prefix:   # the chunks before: fill the cache with each sequence's first tokens
                for seq, chunk in zip(seqs, first_chunks):
                    seq.num_cached_tokens = 0
                runner.run([schedule(seq, chunk) for seq, chunk in zip(seqs, first_chunks)], True)
                computed(seqs)
                batch = [schedule(seq) for seq in seqs]
            logits = runner.compute_logits(batch, True)
            for seq, row in zip(seqs, logits):
                torch.testing.assert_close(row, reference_logits(runner, seq.token_ids), atol=ATOL, rtol=0)
    finally:
        runner.exit()


def test_decode_copies_keep_rows_of_finished_sequences_and_attend_by_length_range():
    """40 sequences of different lengths: the copies are filled once in order of
    length and attended in several ranges; as sequences finish, their rows stay
    (dead) until a quarter of the rows are, and every row still matches."""
    runner = make_runner(16, num_kvcache_blocks=256, max_num_seqs=48)
    try:
        blocks = Blocks(runner)
        lengths = [3 + (17 * i) % 50 for i in range(40)]
        seqs = []
        for i, n in enumerate(lengths):
            table = list(range(blocks.next_id, blocks.next_id + -(-(n + 12) // 16)))
            blocks.next_id += len(table)
            seqs.append(new_seq(runner, i, tokens(n, salt=40 + i), table))
        for seq, token_id in zip(seqs, runner.run([schedule(seq) for seq in seqs], True)):
            seq.append_token(token_id)
        computed(seqs)
        plans, batch = [], list(seqs)
        for step in range(12):
            logits = runner.compute_logits(batch, False)
            plans.append(runner.kv_copy_planner.last)
            for seq, row in zip(batch, logits):
                torch.testing.assert_close(row, reference_logits(runner, seq.token_ids), atol=ATOL, rtol=0)
                seq.num_cached_tokens = seq.num_tokens
                seq.append_token(int(row.argmax()))
            batch = [seq for j, seq in enumerate(batch) if j != (7 * step) % len(batch)]   # one finishes
        assert not plans[0].reuse and len(plans[0].buckets) == min(KV_COPY_BUCKETS, 40 // KV_COPY_BUCKET_ROWS) > 1
        assert [plan.lens.count(0) for plan in plans[:11]] == list(range(11))   # rows kept, dead
        assert all(plan.reuse for plan in plans[1:11]) and not plans[11].reuse   # 11 of 40 dead: refilled
        assert plans[11].lens.count(0) == 0 and len(plans[11].lens) == 29
    finally:
        runner.exit()


def test_kv_copies_bookkeeping():
    keys = [("a", 0), ("b", 1), ("c", 2)]
    copies = KVCopies.refill(keys, [30, 10, 20], 48)
    assert copies.row_by_key == {("b", 1): 0, ("c", 2): 1, ("a", 0): 2} and copies.row_of_seq == [2, 0, 1]
    assert copies.seq_of_row == [1, 2, 0] and copies.buckets == ((0, 3, 30),)
    step = copies.advance(keys, [31, 11, 21])
    assert step.reuse and step.row_of_seq == [2, 0, 1] and step.lens == [11, 21, 31]
    assert copies.advance(keys, [31, 12, 21]) is None        # not one token longer
    assert copies.advance(keys, [49, 11, 21]) is None        # past the copies' width
    assert copies.advance(keys[:2] + [("d", 3)], [31, 11, 5]) is None   # a sequence the copies do not hold
    assert copies.advance(keys[:2], [31, 11]) is None        # a third of the rows dead: refill
    many = KVCopies.refill([(i, i) for i in range(8)], list(range(10, 18)), 32)
    fewer = many.advance([(i, i) for i in range(1, 8)], list(range(12, 19)))
    assert fewer.lens[0] == 0 and fewer.row_of_seq == list(range(1, 8))
    assert fewer.advance([(i, i) for i in range(8)], list(range(12, 20))) is None   # a dead row does not come back
    assert fewer.advance([(i, i) for i in range(1, 8)], list(range(13, 20))).lens[0] == 0


def generate(runner, blocks, prompts, num_tokens, temperature, seq_ids) -> list[list[int]]:
    """Prefill then decode `num_tokens` steps, all prompts in one batch."""
    seqs = [new_seq(runner, seq_id, ids, blocks.take(len(ids) + num_tokens), temperature)
            for seq_id, ids in zip(seq_ids, prompts)]
    is_prefill = True
    for _ in range(num_tokens):
        if is_prefill:
            for seq in seqs:
                schedule(seq)
        token_ids = runner.run(seqs, is_prefill)
        for seq, token_id in zip(seqs, token_ids):
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(token_id)
        is_prefill = False
    return [seq.completion_token_ids for seq in seqs]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_equals_alone(runner, temperature):
    prompts = [tokens(n, salt=10 + n) for n in (5, 22, 13)]
    batched = generate(runner, Blocks(runner), prompts, 12, temperature, [0, 1, 2])
    alone = [generate(runner, Blocks(runner), [p], 12, temperature, [i])[0] for i, p in enumerate(prompts)]
    assert batched == alone
    if temperature > 0:   # the same again: seeded, so reproducible
        assert generate(runner, Blocks(runner), prompts, 12, temperature, [0, 1, 2]) == batched


def test_cuda_graph_buckets_on_cpu_match_eager():
    """use_cuda_graph on the CPU runs the padded, bucketed decode path eagerly:
    5 seqs at most -> buckets 1, 2, 4, 5, so a batch of 3 runs padded to 4."""
    graphed = make_runner(4, max_num_seqs=5, use_cuda_graph=True)
    assert graphed.graph_runner.batch_sizes == [1, 2, 4, 5]
    eager = make_runner(4)
    results = []
    for runner in (graphed, eager):
        blocks = Blocks(runner)
        prompts = [tokens(n, salt=n) for n in (6, 9, 14)]
        results.append(generate(runner, blocks, prompts, 8, 0.0, [0, 1, 2]))
    assert results[0] == results[1]
    graphed.exit()
    eager.exit()


@pytest.mark.parametrize("max_num_seqs", [1, 3, 8, 12, 100, 512, 600])
def test_graph_buckets_cover_every_batch_size(max_num_seqs):
    sizes = graph_batch_sizes(min(max_num_seqs, 512))
    assert sizes == sorted(set(sizes))
    assert all(any(b >= n for b in sizes) for n in range(1, min(max_num_seqs, 512) + 1))


def test_device_dtype_and_default_cache_size():
    runner = make_runner(16, num_kvcache_blocks=-1, max_num_seqs=4)
    assert runner.device == torch.device("cpu") and runner.dtype == torch.float32
    assert runner.num_kvcache_blocks == 256 * 4 // 16   # max_model_len * min(max_num_seqs, 16) tokens
    assert runner.kv_cache.shape[2] == runner.num_kvcache_blocks + 1   # and the scratch block
    runner.exit()


def test_bfloat16_on_request():
    runner = make_runner(4, dtype="bfloat16")
    assert runner.dtype == torch.bfloat16
    seq = schedule(new_seq(runner, 0, tokens(10), list(range(4))))
    assert len(runner.run([seq], True)) == 1
    runner.exit()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when CUDA is absent")
def test_cuda_requested_without_cuda():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        make_runner(4, device="cuda")


# --- sampler -----------------------------------------------------------------

def test_greedy_is_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    assert Sampler(torch.device("cpu"))(logits, [0.0] * 6, list(range(6))).tolist() == logits.argmax(-1).tolist()


def test_sampling_is_seeded_and_batch_independent():
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1))
    temps = [1.0, 0.0, 0.7, 1.5]
    seeds = [sample_seed(0, seq_id, 10) for seq_id in range(4)]
    batched = sampler(logits, temps, seeds).tolist()
    assert sampler(logits, temps, seeds).tolist() == batched
    assert [sampler(logits[i:i + 1], temps[i:i + 1], seeds[i:i + 1]).item() for i in range(4)] == batched
    assert batched[1] == logits[1].argmax().item()   # a greedy row in a sampled batch stays greedy


def test_sampling_follows_the_distribution():
    sampler = Sampler(torch.device("cpu"))
    logits = torch.log(torch.tensor([[0.25, 0.75]])).expand(2000, 2)
    seeds = [sample_seed(0, seq_id, 1) for seq_id in range(2000)]
    frequency = sum(sampler(logits, [1.0] * 2000, seeds).tolist()) / 2000
    assert abs(frequency - 0.75) < 0.04   # 2000 draws: std of the mean about 0.01


@pytest.mark.parametrize("vocab", [5, CDF_CHUNK, CDF_CHUNK + 1, 3 * CDF_CHUNK - 7])
def test_inverse_cdf_matches_a_full_running_sum(vocab):
    """The two-level search (chunk sums, then one chunk) picks what one running
    sum over the whole vocabulary picks, and never a token of weight 0."""
    generator = torch.Generator().manual_seed(vocab)
    weights = torch.rand(64, vocab, generator=generator) ** 4
    weights[:, ::7] = 0
    u = torch.rand(64, generator=generator, dtype=torch.float64)
    cdf = weights.double().cumsum(1)
    expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    drawn = inverse_cdf(weights, u)
    assert drawn.tolist() == expected.tolist()
    assert bool((weights.gather(1, drawn[:, None]) > 0).all())


def test_sample_seed_depends_on_every_part():
    base = sample_seed(0, 1, 2)
    assert base == sample_seed(0, 1, 2)
    assert len({base, sample_seed(1, 1, 2), sample_seed(0, 2, 2), sample_seed(0, 1, 3)}) == 4


# --- benchmarks ----------------------------------------------------------------

def test_benchmarks_compile():
    for name in ("bench_vs_transformers.py", "gpu_check.py"):
        py_compile.compile(os.path.join(ROOT, "benchmarks", name), doraise=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when CUDA is absent")
def test_gpu_check_imports_what_it_uses():
    # The script runs only where a GPU is lent: a broken import must show up here first.
    code = "import sys; sys.argv = ['gpu_check.py']; import runpy; runpy.run_path('gpu_check.py', run_name='check')"
    subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "benchmarks"), check=True,
                   env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "benchmarks")})


def test_gpu_check_without_cuda_says_so():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 1
    assert "CUDA is not available" in result.stderr
    assert result.stderr.count("\n") == 1
