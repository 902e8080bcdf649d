"""The Python Llama engine's launches through kpack (examples/llama/python/engine.py), as the
recording fake CUDA driver receives them, on the tiny checkpoint and kernels/llamapack:
the decode and prefill steps are docs/llama.md's launch sequence with its arguments, a
graph replay sends the eager step's parameters, and graphs are built once per batch
bucket and never as the context grows. The fake driver computes nothing here (no emulators
for these kernels): device memory is host memory, torch CPU tensors go as addresses.

Needs torch (the engine's tensors); CI, without torch, skips this file.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import KERNELS  # noqa: E402

LLAMA_PY = Path(__file__).resolve().parents[2] / "examples" / "llama" / "python"
sys.path.insert(0, str(LLAMA_PY))

import checkpoint  # noqa: E402
import config  # noqa: E402
import engine  # noqa: E402

PACK = KERNELS / "llamapack"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_plan")
    checkpoint.write_checkpoint(out, config.preset_dict("tiny"), seed=2, backend="numpy")
    return out


@pytest.fixture
def eng(tiny, driver, fake):
    fake.use_primary_context()
    return engine.LlamaEngine(str(tiny), str(PACK), "eager", max_batch=8, max_prompt=32,
                              capacity=64, device="cpu", driver=driver)


def kernel_of(entry: str) -> str:
    return {"llama_proj_residual": "proj"}.get(entry, entry)


def decode_names(L: int, rows: int = 3) -> list:
    """The step's kernels; above one row llama_rmsnorm before QKV, gate/up and the LM head."""
    norm = ["llama_rmsnorm"] if rows > 1 else []
    layer = norm + ["llama_qkv_rope", "llama_attn_decode", "proj"] + norm + [
        "llama_gate_up", "proj"]
    return ["llama_embed"] + layer * L + norm + ["llama_lm_head"]


def params_of(eng, call, launch, layouts):
    """{param: value} of a recorded launch, read at the chosen variant's offsets."""
    k = eng.pack[call.kernel]
    variant = k.select_variant(*eng.backend._args(call))
    offsets = layouts("llamapack", call.kernel, variant)
    types = {p.name: p.type for p in k.params}
    out = {}
    for name, off in offsets.items():
        t = types.get(name, "")
        if t.startswith("*"):
            out[name] = launch.u64(off)
        elif t == "fp32":
            out[name] = launch.f32(off)
        elif t in ("i32", "u32"):
            out[name] = launch.i32(off)
        elif t == "i64":
            out[name] = launch.i64(off)
    return out


def test_decode_step_is_the_contract_sequence(eng, fake, layouts):
    cfg = eng.cfg
    eng.prefill(config.prompt_tokens(3, [4, 2, 7], 0, cfg.V))
    eng.set_batch(3)
    calls = eng.state.decode_calls(3)
    mark = fake.launch_count()
    eng.decode_step()
    launches = fake.launches_since(mark)
    assert [kernel_of(x.entry) for x in launches] == decode_names(cfg.L)
    assert len(launches) == 7 * cfg.L + 3
    S = config.decode_splits(3, cfg.NKV)
    assert S == 32  # min(S_MAX, 384 / (4 * NKV 2))
    for call, launch in zip(calls, launches):
        p = params_of(eng, call, launch, layouts)
        want = dict(zip(engine.PARAMS[call.kernel], eng.backend._args(call)))
        for name, value in p.items():
            if isinstance(want[name], float):
                assert value == struct.unpack("<f", struct.pack("<f", want[name]))[0], name
            else:
                assert value == want[name], (call.kernel, name)
        assert p.get("M", 3) == 3
    attn = launches[3]
    assert attn.grid == (S, cfg.NKV, 3)
    # The normalized rows: llama_rmsnorm writes xn, QKV reads it (and h, for one row).
    norm = params_of(eng, calls[1], launches[1], layouts)
    qkv = params_of(eng, calls[2], launches[2], layouts)
    assert norm["xn"] == qkv["xn"] == eng.state.xn.data_ptr()
    assert norm["norm_w"] == qkv["norm_w"] and norm["M"] == 3
    lm = params_of(eng, calls[-1], launches[-1], layouts)
    assert lm["advance"] == 1 and lm["tokens"] == eng.state.tokens.data_ptr()
    assert lm["keep_logits"] == 0  # the engine reads no logits: its LM head writes none


def test_logits_are_written_only_for_an_engine_that_reads_them(tiny, driver, fake, eng,
                                                                layouts):
    """keep_logits follows read_logits in the decode step and the prefill; an engine
    made without it refuses logits (digests, keep_logits) before launching anything."""
    prompts = config.prompt_tokens(2, [3, 5], 1, eng.cfg.V)
    mark = fake.launch_count()
    for call in (lambda: eng.prefill(prompts, keep_logits=True),
                 lambda: eng.run_sequence(prompts, 2, digests=True),
                 lambda: eng.run_sequence(prompts, 2, keep_logits=True)):
        with pytest.raises(ValueError, match="read_logits=True"):
            call()
    assert fake.launch_count() == mark
    reads = engine.LlamaEngine(str(tiny), str(PACK), "eager", max_batch=8, max_prompt=32,
                               capacity=64, device="cpu", driver=driver, read_logits=True)
    s = reads.state
    mark = fake.launch_count()
    reads.prefill(prompts[:1], keep_logits=True)
    reads.set_batch(1)
    reads.decode_step()
    launches = fake.launches_since(mark)
    assert len(launches) == 7 * reads.cfg.L + 2 + 5 * reads.cfg.L + 2
    prefill_lm = params_of(reads, s.prefill_calls(0, 3)[-1], launches[7 * reads.cfg.L + 1],
                           layouts)
    decode_lm = params_of(reads, s.decode_calls(1)[-1], launches[-1], layouts)
    assert prefill_lm["keep_logits"] == decode_lm["keep_logits"] == 1


def test_prefill_is_one_step_then_the_lm_head_on_the_last_row(eng, fake, layouts):
    cfg, s = eng.cfg, eng.state
    prompt = config.prompt_tokens(2, [3, 20], 1, cfg.V)
    mark = fake.launch_count()
    eng.prefill(prompt)
    launches = fake.launches_since(mark)
    per_row = 7 * cfg.L + 2  # prompts of 3 and 20 tokens: normalized rows, then one row
    assert len(launches) == 2 * per_row
    row1 = launches[per_row:]
    names = [kernel_of(x.entry) for x in row1]
    assert names[1] == "llama_rmsnorm" and names[3] == "llama_attn_prefill"
    assert names[-2] == "proj" and names[-1] == "llama_lm_head"
    calls = s.prefill_calls(1, 20)
    for call, launch in zip(calls[:-1], row1[:-1]):
        assert params_of(eng, call, launch, layouts).get("M", 20) == 20
    lm = params_of(eng, calls[-1], row1[-1], layouts)
    assert lm["M"] == 1 and lm["advance"] == 0 and lm["keep_logits"] == 0
    assert lm["h"] == s.h.data_ptr() + 19 * cfg.H * 4
    assert lm["logits"] == s.logits.data_ptr() + cfg.V * 4
    assert lm["counters"] == s.lm_counters.data_ptr() + 4
    assert lm["tokens"] == s.tokens.data_ptr() + 4 and lm["pos"] == s.pos.data_ptr() + 4
    qkv = params_of(eng, calls[2], row1[2], layouts)
    assert qkv["pos"] == s.ppos.data_ptr() and qkv["seq"] == s.pseq.data_ptr()
    # The host set the decode rows after the prefills: pos = prompt lengths, seq = rows.
    assert s.pos[:2].tolist() == [3, 20] and s.seq[:2].tolist() == [0, 1]
    assert s.ptokens[:20].tolist() == prompt[1] and s.pseq[:20].tolist() == [1] * 20


def test_graph_replay_sends_the_eager_steps_parameters(eng, fake):
    eng.prefill(config.prompt_tokens(3, [4] * 3, 0, eng.cfg.V))
    eng.set_batch(3)
    mark = fake.launch_count()
    eng.decode_step()
    eager = fake.launches_since(mark)
    eng.use("graph")
    eng.set_batch(3)
    mark = fake.launch_count()
    eng.decode_step()
    replayed = fake.launches_since(mark)
    assert [x.entry for x in replayed] == [x.entry for x in eager]
    assert [x.params for x in replayed] == [x.params for x in eager]
    # Grid-tolerant kernels run at their bucket's edge (2-4: 4) in the graph.
    S = config.decode_splits(3, eng.cfg.NKV)
    assert replayed[3].grid == (S, eng.cfg.NKV, 4) and eager[3].grid == (S, eng.cfg.NKV, 3)


def test_graphs_are_built_per_bucket_and_never_as_the_context_grows(eng, fake):
    eng.prefill(config.prompt_tokens(8, [5] * 8, 0, eng.cfg.V))
    eng.use("graph")
    graph_stats = lambda: eng.backend.stats()  # noqa: E731
    n = 7 * eng.cfg.L + 3  # launches of a step above one row
    eng.set_batch(3)
    for _ in range(3):
        eng.decode_step()
    st = graph_stats()
    assert st["graphs_built"] == 1 and st["replays"] == 3 and st["nodes_patched"] == 0
    eng.set_batch(2)  # same bucket (2-4): M patched in every launch, no new graph
    eng.decode_step()
    st = graph_stats()
    assert st["graphs_built"] == 1 and st["last_nodes_patched"] == n
    eng.set_batch(8)  # bucket 5-16: S changes too; a second graph
    eng.decode_step()
    eng.decode_step()
    st = graph_stats()
    assert st["graphs_built"] == 2 and st["last_nodes_patched"] == 0
    # PDL edges at every batch (config.programmatic_edges): each launch after a step's
    # first follows a node through one; batch 1 replays a step graph of its own.
    edges = lambda: [g["programmatic_edges"] for g in eng.backend.graph.graphs()]  # noqa: E731
    assert edges() == [n - 1, n - 1]
    eng.set_batch(1)
    mark = fake.launch_count()
    eng.decode_step()
    assert graph_stats()["graphs_built"] == 3
    assert edges() == [5 * eng.cfg.L + 2 - 1]
    # One row's step has no llama_rmsnorm: launches of its own, with its own arguments.
    one = fake.launches_since(mark)
    assert [kernel_of(x.entry) for x in one] == decode_names(eng.cfg.L, rows=1)
    eng.set_batch(4)
    mark = fake.launch_count()
    eng.decode_step()
    assert graph_stats()["graphs_built"] == 3 and edges() == [n - 1, n - 1]
    assert [kernel_of(x.entry) for x in fake.launches_since(mark)] == decode_names(eng.cfg.L)


def test_eager_steps_switch_between_one_row_and_more(eng, fake, layouts):
    """One row and more rows launch different kernel sequences (llama_rmsnorm above one
    row): each keeps bound launches of its own, and switching back and forth sends each
    step the arguments of its calls."""
    eng.prefill(config.prompt_tokens(3, [4] * 3, 0, eng.cfg.V))
    for batch in (3, 1, 3, 1):
        eng.set_batch(batch)
        calls = eng.state.decode_calls(batch)
        mark = fake.launch_count()
        eng.decode_step()
        launches = fake.launches_since(mark)
        assert [kernel_of(x.entry) for x in launches] == decode_names(eng.cfg.L, rows=batch)
        for call, launch in zip(calls, launches):
            p = params_of(eng, call, launch, layouts)
            want = dict(zip(engine.PARAMS[call.kernel], eng.backend._args(call)))
            for name in ("M", "h", "xn", "w"):
                if name in p:
                    assert p[name] == want[name], (batch, call.kernel, name)


def test_engine_refuses_prompts_longer_than_the_cache(tiny, driver, fake):
    fake.use_primary_context()
    with pytest.raises(ValueError, match="prompts of up to 65 tokens do not fit a KV capacity "
                                         "of 64 positions"):
        engine.LlamaEngine(str(tiny), str(PACK), "eager", max_batch=2, max_prompt=65,
                           capacity=64, device="cpu", driver=driver)


def test_engine_refuses_a_batch_past_the_grid_limit(tiny, driver, fake):
    fake.use_primary_context()
    with pytest.raises(ValueError, match="a batch of up to 65536 rows: decode attention's grid "
                                         "holds the batch along z, which the driver limits to "
                                         "65535"):
        engine.LlamaEngine(str(tiny), str(PACK), "eager", max_batch=65536, max_prompt=8,
                           capacity=64, device="cpu", driver=driver)


def test_prefill_refuses_bad_rows_before_it_launches(eng, fake):
    """As the C++ engine's Prefill: too many rows (row max_batch would write another
    layer's cache slot), tokens outside the vocabulary, prompts and steps past the cache,
    all refused with nothing launched."""
    V = eng.cfg.V
    mark = fake.launch_count()
    with pytest.raises(ValueError, match=r"a prefill of 9 rows; the engine has rows 0\.\.7"):
        eng.prefill([[1]] * 9)
    with pytest.raises(ValueError, match=f"prefill of row 1: prompt token 2 is {V}, outside "
                                         f"the vocabulary of {V}"):
        eng.prefill([[1, 2], [3, 4, V]])
    with pytest.raises(ValueError, match="prompt token 0 is -1"):
        eng.prefill([[-1]])
    with pytest.raises(ValueError, match="a prompt of 30 tokens and 40 decode steps need 70 KV "
                                         "positions per sequence; the capacity is 64"):
        eng.run_sequence([[1] * 30], 40)
    assert fake.launches_since(mark) == []


def test_decode_refuses_rows_without_a_sequence_or_room(eng, fake):
    """The host's copy of each row's position: a row never prefilled, and a step past the
    KV capacity (where QKV would store nothing and attention read stale positions), are
    refused with nothing launched; the rows' positions follow prefill, fill_synthetic,
    decode_step and run_sequence."""
    eng.prefill([[1, 2, 3]])
    eng.set_batch(2)
    mark = fake.launch_count()
    with pytest.raises(ValueError, match="decode row 1: sequence slot 1 holds no sequence"):
        eng.decode_step()
    with pytest.raises(ValueError, match="decode row 1: sequence slot 1 holds no sequence"):
        eng.run_sequence(None, 1, batch=2)
    assert fake.launches_since(mark) == []
    eng.fill_synthetic(2, 60, fill_cache=False)
    eng.run_sequence(None, 2, batch=2)  # positions 60, 61
    eng.decode_step()                   # 62
    eng.decode_step()                   # 63: the cache is full
    assert eng.state.positions[:2] == [64, 64]
    mark = fake.launch_count()
    with pytest.raises(ValueError, match="decode row 0: sequence slot 0 is at position 64, and "
                                         "the KV cache holds 64 positions per sequence"):
        eng.decode_step()
    eng.fill_synthetic(2, 62, fill_cache=False)
    with pytest.raises(ValueError, match="at position 62.*3 more tokens would not fit"):
        eng.run_sequence(None, 3, batch=2)
    assert fake.launches_since(mark) == []
    with pytest.raises(ValueError, match=r"synthetic context for 9 rows: the engine has rows "
                                         r"1\.\.8"):
        eng.fill_synthetic(9, 10)
