"""Speculative decoding in the TUI, `render` and `export`: a request's drafts and what each step
kept, from tracengine's engine (DraftProposed, DraftVerified) and from vLLM's scheduler
(SpecDraft, SpecDecode, SpecAccepted), checked against the trace's own events."""
import json
import warnings

import pytest

from tracengine.analysis.render import describe_event, render_steps
from tracengine.cli import main
from tracengine.trace.events import (DraftProposed, DraftVerified, SpecAccepted, SpecDecode, SpecDraft,
                                     TokenSample)
from tracengine.trace.tracelog import TraceReader
from tracengine.tui.app import TraceApp
from tracengine.tui.seq_view import SeqScreen
from tracengine.tui.trace_index import TraceIndex
from tracengine.tui.widgets.header import Explanation

SIZE = (140, 40)
LINES = ["the scheduler decides which sequences run at every step of the engine, ",
         "SELECT id, name FROM users WHERE id = 1;\n"]


def events_of(path) -> list:
    with TraceReader(path) as reader:
        return list(reader.events())


@pytest.fixture(scope="module")
def engine_trace(tmp_path_factory):
    """`generate` with ngram drafts, on the embedded model, over prompts that repeat a line."""
    folder = tmp_path_factory.mktemp("spec_tui")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": LINES[i % 2] * (2 + i % 3)}) + "\n" for i in range(6)))
    path = str(folder / "k3.trace")
    assert main(["generate", "--prompts-file", str(prompts), "--max-tokens", "48", "--ignore-eos",
                 "--temperature", "0", "--set", "num_speculative_tokens=3", "--set", "speculative_method=ngram",
                 "--record", path, "--quiet"]) == 0
    return path


@pytest.fixture(scope="module")
def vllm_trace(tmp_path_factory):
    """vLLM's own scheduler with ngram drafts, driven as its engine core drives it (the deprecations
    torch and vLLM raise while vLLM imports and builds are theirs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
        from tracengine.vllm.build import build_scheduler, default_config
        from tracengine.vllm.drive import RequestSpec, run
        path = str(tmp_path_factory.mktemp("spec_tui_vllm") / "vllm_spec.trace")
        config = default_config(num_gpu_blocks=32, max_num_batched_tokens=128, max_num_seqs=16,
                                speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                prompt_lookup_max=3)
        scheduler = build_scheduler(config, record=path)
        run(scheduler, [RequestSpec(f"req-{i}", list(range(100, 132)) + [i] * (20 + 5 * i), 24, arrival_step=i)
                        for i in range(5)])
        scheduler.shutdown()
    return path


def expected_verifies(events) -> dict[int, list[tuple]]:
    """seq_id -> (step, drafts verified, kept, the drafts' tokens, the tokens appended), from the
    events alone, for either engine's events."""
    proposed, scheduled, out = {}, {}, {}
    sampled: dict[tuple[int, int], list[int]] = {}
    for e in events:
        if type(e) is TokenSample and e.kept:
            sampled.setdefault((e.step, e.seq_id), []).append(e.token_id)
    for e in events:
        t = type(e)
        if t is DraftProposed:
            proposed[e.seq_id] = list(e.draft_token_ids)
        elif t is SpecDraft:
            proposed[e.seq_id] = list(e.token_ids)
        elif t is SpecDecode:
            scheduled.update(zip(e.seq_ids, e.num_spec_tokens))
        elif t is DraftVerified and not e.padded:
            out.setdefault(e.seq_id, []).append((e.step, e.num_draft_tokens, e.num_accepted_tokens,
                                                 proposed.get(e.seq_id, [])[:e.num_draft_tokens],
                                                 sampled.get((e.step, e.seq_id), [])))
        elif t is SpecAccepted:
            for s, a in zip(e.seq_ids, e.num_accepted):
                out.setdefault(s, []).append((e.step, scheduled[s], a, proposed.get(s, [])[:scheduled[s]],
                                              sampled.get((e.step, s), [])))
    return out


def line_of(step, num_drafts, num_kept, drafts, appended) -> tuple[int, str]:
    ids = " ".join(map(str, drafts))
    return step, (f"verifies {num_drafts} draft{'s' if num_drafts != 1 else ''}" + (f" [{ids}]" if drafts else "")
                  + f", keeps {num_kept}: appends [{' '.join(map(str, appended))}]")


async def shows_drafts_and_what_was_kept(path):
    events = events_of(path)
    verifies = expected_verifies(events)
    seq_id = max(verifies, key=lambda s: sum(v[2] for v in verifies[s]))      # the one that kept most
    app = TraceApp(TraceIndex(path))
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("s", *str(seq_id), "enter", "o")
        assert isinstance(app.screen, SeqScreen)
        shown = [line for line in app.screen.lines if line[1].startswith("verifies")]
        assert shown == [line_of(*v) for v in verifies[seq_id]]
        drafted, kept = sum(v[1] for v in verifies[seq_id]), sum(v[2] for v in verifies[seq_id])
        assert f"{drafted} drafts verified in {len(shown)} steps, {kept} kept" in app.screen.summary
        kept_step = next(v for v in verifies[seq_id] if v[2])
        index = app.screen.lines.index(line_of(*kept_step))
        await pilot.press("home", *["down"] * index, "enter")      # the line goes to its step
        assert app.step == kept_step[0]
        await pilot.pause()
        explanation = str(app.query_one(Explanation).render())
        assert "with their drafts" in explanation
        assert f"seq {seq_id} {kept_step[2]} of {kept_step[1]}" in explanation.split("drafts kept: ")[1]
    return events, verifies


async def test_the_tui_shows_an_engine_requests_drafts_and_what_was_kept(engine_trace):
    events, verifies = await shows_drafts_and_what_was_kept(engine_trace)
    assert sum(v[2] for vs in verifies.values() for v in vs) > 0


async def test_the_tui_shows_a_vllm_requests_drafts_and_what_was_kept(vllm_trace):
    events, verifies = await shows_drafts_and_what_was_kept(vllm_trace)
    assert all(v[3] for vs in verifies.values() for v in vs)       # synchronous: every draft's tokens known


@pytest.mark.parametrize("which", ["engine", "vllm"])
def test_render_and_export_show_the_drafts(which, engine_trace, request, tmp_path):
    path = engine_trace if which == "engine" else request.getfixturevalue("vllm_trace")
    events = events_of(path)
    verifies = expected_verifies(events)
    step, num_drafts, num_kept = next((v[0], v[1], v[2]) for vs in verifies.values() for v in vs)
    seq_id = next(s for s, vs in verifies.items() if any(v[0] == step for v in vs))
    rows = render_steps(events, (step, step + 1)).splitlines()
    line = next(row for row in rows if row.lstrip().startswith(str(step)))
    kept = f"s{seq_id}:{num_kept}/{num_drafts}" if which == "engine" else f"s{seq_id}:{num_kept}"
    assert "kept " in line and kept in line.split("kept ")[1].split(";")[0]
    verified = next(e for e in events if type(e) in (DraftVerified, SpecAccepted) and e.step == step)
    assert "generic" not in describe_event(verified) and "=" not in describe_event(verified)
    out = tmp_path / "out.json"
    assert main(["export", path, "--perfetto", str(out)]) == 0
    counters = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "drafts"]
    assert sum(e["args"]["num_accepted_tokens"] for e in counters) == sum(
        v[2] for vs in verifies.values() for v in vs)
