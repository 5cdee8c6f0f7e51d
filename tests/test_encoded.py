"""Token ids that carry their own msgpack encoding (trace/encoded.py): the trace a writer
makes of them is the one it makes of the plain list, byte for byte."""
import copy
import dataclasses
import pickle
from pathlib import Path

import msgspec
import pytest

from tracengine.engine.block_hasher import compute_hashes
from tracengine.engine.sequence import Sequence
from tracengine.trace.encoded import EncodedTokens, array_header, encoded_items

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("length", [0, 1, 15, 16, 65535, 65536, 70001])
def test_the_head_and_the_items_are_what_msgspec_writes(length):
    # token ids of every msgpack int width: fixint, uint8, uint16, uint32
    tokens = [(i * 7919) % 151936 for i in range(length)]
    assert array_header(length) + encoded_items(tokens) == msgspec.msgpack.encode(tokens)


@pytest.mark.parametrize("num_tokens", [1, 511, 512, 513, 1535, 1536])
def test_pieces_cut_to_a_length_encode_as_their_tokens(num_tokens):
    pieces = [(t, encoded_items(t))
              for t in (tuple(range(b * 300, b * 300 + 512)) for b in range(-(-num_tokens // 512)))]
    tokens = EncodedTokens.from_pieces(pieces, num_tokens)
    plain = [t for piece, _ in pieces for t in piece][:num_tokens]
    assert tokens == plain and isinstance(tokens, list)
    assert tokens.msgpack() == msgspec.msgpack.encode(plain)
    with pytest.raises(ValueError, match="more than the last piece"):
        EncodedTokens.from_pieces(pieces + pieces[:1], num_tokens)


def test_they_are_read_only_and_survive_a_pickle_and_a_copy():
    tokens = EncodedTokens([1, 2, 300], (encoded_items([1, 2]), encoded_items([300])))
    for change in (lambda t: t.append(4), lambda t: t.extend([4]), lambda t: t.__setitem__(0, 9),
                   lambda t: t.__delitem__(0), lambda t: t.pop(), lambda t: t.sort(), lambda t: t.clear()):
        with pytest.raises(TypeError, match="read-only"):
            change(tokens)
    assert tokens == [1, 2, 300] and tokens.msgpack() == msgspec.msgpack.encode([1, 2, 300])
    for other in (pickle.loads(pickle.dumps(tokens)), copy.copy(tokens), copy.deepcopy(tokens)):
        assert type(other) is EncodedTokens and other == tokens and other.msgpack() == tokens.msgpack()


def test_a_sequence_keeps_an_encoded_prompt_and_decodes_into_its_own_list():
    prompt = EncodedTokens([5, 6, 7], (encoded_items([5, 6, 7]),))
    seq = Sequence(0, prompt, 2)
    assert seq.block_hashes == compute_hashes([5, 6], 2)     # its full block, hashed
    assert seq.prompt is prompt and seq.prompt_token_ids is prompt     # kept, not copied
    seq.append_token(8)
    seq.append_token(9)
    assert prompt == [5, 6, 7] and seq.completion == [8, 9] and seq.token_ids == [5, 6, 7, 8, 9]
    assert seq.completion_token_ids == [8, 9] and seq.completion_token_ids is not seq.completion
    # token_ids[start:end] across the prompt's end, by tokens() and by subscript, and the blocks
    for start in range(6):
        for end in range(start, 6):
            assert seq.tokens(start, end) == seq[start:end] == [5, 6, 7, 8, 9][start:end]
    assert [seq[i] for i in range(-5, 5)] == [5, 6, 7, 8, 9] * 2 and seq[::2] == [5, 7, 9]
    assert seq.tokens(0, 3) is not prompt and seq[:3] is not prompt     # new lists, as slices are
    for out_of_range in (5, -6):
        with pytest.raises(IndexError):
            seq[out_of_range]
    assert [seq.block(i) for i in range(seq.num_blocks)] == [[5, 6], [7, 8], [9]]
    tokens = [5, 6, 7]
    plain = Sequence(1, tokens, 2)
    tokens.append(99)        # the caller's list changes: the sequence copied it
    plain.append_token(8)
    assert plain.prompt_token_ids == [5, 6, 7] and plain.token_ids == [5, 6, 7, 8]


def test_mooncake_prompts_carry_their_encoding():
    from tracengine.workload import read_workload
    for length_scale in (1.0, 0.3):
        for r in read_workload(str(DATA / "mooncake_sample.jsonl"), vocab_size=151936, length_scale=length_scale):
            assert type(r.prompt) is EncodedTokens
            assert r.prompt.msgpack() == msgspec.msgpack.encode(list(r.prompt))


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_a_recording_of_encoded_prompts_is_the_recording_of_the_plain_ones(tmp_path, policy, monkeypatch):
    """The same bytes on file: requests added between steps and before the first, with
    preemptions, recorded from prompts with their encoding and from plain lists."""
    from tracengine.engine.config import Config
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.engine import simulate, simulation_header
    from tracengine.trace.tracelog import TraceWriter, open_trace
    from tracengine.workload import read_workload
    from tests.test_simulate import TINY
    step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(TINY, "tiny"), "H100")
    requests = [dataclasses.replace(r, max_tokens=40) for r in
                read_workload(str(DATA / "mooncake_sample.jsonl"), vocab_size=151936, length_scale=0.5) * 3]
    plain = [dataclasses.replace(r, prompt=list(r.prompt)) for r in requests]
    assert all(type(r.prompt) is EncodedTokens for r in requests) and all(type(r.prompt) is list for r in plain)
    config = Config(num_kvcache_blocks=60, kvcache_block_size=16, max_num_batched_tokens=64, max_model_len=1024,
                    scheduling_policy=policy)
    header = simulation_header(config, step_time)
    copied = []      # the prompts whose encoding the writer copied
    encoding = EncodedTokens.msgpack
    monkeypatch.setattr(EncodedTokens, "msgpack", lambda self: copied.append(self) or encoding(self))
    paths = []
    for name, workload in (("encoded", requests), ("plain", plain)):
        paths.append(tmp_path / f"{name}.trace")
        with TraceWriter(paths[-1], header, deflate=False) as writer:
            simulate(config, workload, step_time, writer, header)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert len(copied) == len(requests)
    events = list(open_trace(str(paths[0])))
    added = [e for e in events if type(e).__name__ == "RequestAdded"]
    assert len(added) == len(requests) and all(e.prompt_token_ids == requests[e.seq_id].prompt for e in added)
    assert any(type(e).__name__ == "Preempt" for e in events)
