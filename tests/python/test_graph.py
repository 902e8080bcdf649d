"""kpack.graph (kpack::StepGraph) against the recording fake driver: graphs of bound launches
replayed with new sizes and tensors, what the driver is sent, and the errors.

kernels/graphpack's vector_add is grid-tolerant: its graph grid is cdiv(edge, 1024) for its
bucket's upper edge (4096, 65536, 2^20), whatever n is inside the bucket. Its softmax is not.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import kpack
import kpack_testing as _testing

from test_launch import addr, tensor


@pytest.fixture
def va(open_pack):
    return open_pack("graphpack").vector_add


def test_replays_patch_arguments_inside_a_bucket(fake, va, layouts):
    a = va.bind(tensor(0), tensor(1), tensor(2), 1000)      # bucket 0, generic (n % 16)
    b = va.bind(tensor(0), tensor(1), tensor(3), 70001)     # bucket 2
    g = kpack.graph([a, b])
    assert isinstance(g, kpack.StepGraph) and g.launches == (a, b) and g.unseen == "build"
    assert g.signature == "vector_add/b0_generic[4,1,1]; vector_add/b2_generic[1024,1,1]"
    s = fake.stream_create()
    mark = fake.launch_count()
    g.replay(stream=s)
    launches = fake.launches_since(mark)
    off = layouts("graphpack", "vector_add", "b0_generic")
    assert [launch.grid for launch in launches] == [(4, 1, 1), (1024, 1, 1)]
    assert {launch.stream for launch in launches} == {s}
    assert launches[0].i32(off["n"]) == 1000 and launches[1].i32(off["n"]) == 70001

    a.set("n", 3001)
    a.set("out_ptr", tensor(5))
    mark = fake.launch_count()
    g.replay(stream=s)
    first = fake.launches_since(mark)[0]
    assert first.grid == (4, 1, 1)
    assert first.i32(off["n"]) == 3001 and first.u64(off["out_ptr"]) == addr(5)
    stats = g.stats()
    assert stats["graphs_built"] == 1 and stats["replays"] == 2
    assert stats["last_nodes_patched"] == 1 and stats["nodes_patched"] == 1
    assert fake.call_count("GraphExecKernelNodeSetParams") >= 1


def test_replay_follows_the_current_stream(fake, va):
    g = kpack.graph([va.bind(tensor(0), tensor(1), tensor(2), 100)])
    s = fake.stream_create()
    try:
        _testing.set_current_stream(s)
        mark = fake.launch_count()
        g.replay()
        assert fake.last_launch(mark).stream == s
    finally:
        _testing.set_current_stream(0)


def test_declared_shapes_then_unseen_signatures_are_errors(fake, va):
    a = va.bind(tensor(0), tensor(1), tensor(2), 100)
    g = kpack.graph([a], unseen="error")
    s = fake.stream_create()
    with pytest.raises(kpack.FailedPreconditionError, match=r"none was built \(declare"):
        g.replay(stream=s)
    for n in (100, 5001):  # buckets 0 and 1
        a.set("n", n)
        g.build()
    mark = fake.launch_count()
    a.set("n", 3001)
    g.replay(stream=s)
    assert fake.last_launch(mark).grid == (4, 1, 1)
    a.set("n", 70001)
    with pytest.raises(kpack.FailedPreconditionError,
                       match=r"launch 0 is kernel 'vector_add' variant 'b2_generic' "
                             r"\(bucket 65537 <= n <= 1048576\)"):
        g.replay(stream=s)
    g.unseen = "launch_eagerly"
    mark = fake.launch_count()
    g.replay(stream=s)
    assert fake.last_launch(mark).grid == (69, 1, 1)  # eagerly: the exact grid
    assert g.stats()["eager_steps"] == 1
    assert [info["signature"] for info in g.graphs()] == \
        ["vector_add/b0_generic[4,1,1]", "vector_add/b1_generic[64,1,1]"]
    assert g.graphs()[0]["nodes"] == 1 and g.graphs()[0]["build_us"] > 0


def test_errors(fake, open_pack, va):
    a = va.bind(tensor(0), tensor(1), tensor(2), 100)
    with pytest.raises(TypeError, match="launch 1 is not a kpack.BoundLaunch"):
        kpack.graph([a, 5])
    with pytest.raises(kpack.InvalidArgumentError, match="at least one launch"):
        kpack.graph([])
    with pytest.raises(kpack.InvalidArgumentError, match="listed twice"):
        kpack.graph([a, a])
    with pytest.raises(ValueError,
                       match="unseen must be 'build', 'error' or 'launch_eagerly', got 'sometimes'"):
        kpack.graph([a], unseen="sometimes")
    softmax = open_pack("graphpack").softmax
    g = kpack.graph([softmax.bind(tensor(3), tensor(4), 64, 64, 8, 64)])
    with pytest.raises(kpack.InvalidArgumentError, match="'softmax' has no grid_tolerance"):
        g.pin_grid(0, 16)
    with pytest.raises(ValueError, match="1 to 3 axes"):
        kpack.graph([a]).pin_grid(0, (1, 1, 1, 1))
    with pytest.raises(TypeError):
        kpack.graph([a]).replay(stream="s")


def test_unseen_is_spelled_as_in_cpp_and_the_old_spelling_is_deprecated(fake, va):
    a = va.bind(tensor(0), tensor(1), tensor(2), 100)
    for unseen in ("build", "error", "launch_eagerly"):  # StepGraph::Unseen::k...
        assert kpack.graph([a], unseen=unseen).unseen == unseen
    with pytest.warns(DeprecationWarning, match="'eager' is now spelled 'launch_eagerly'"):
        g = kpack.graph([a], unseen="eager")
    assert g.unseen == "launch_eagerly"
    with pytest.warns(DeprecationWarning) as warned:
        g.unseen = "eager"
    assert warned[0].filename == __file__, "the warning points at the caller's line"


def test_a_graph_and_its_launches_are_seen_by_the_garbage_collector(fake, va):
    # A cycle through a graph: graph -> its launches -> a launch's scratch callable -> the
    # graph. Collectable only if the collector sees what the graph holds.
    box = []
    b = va.bind(tensor(0), tensor(1), tensor(2), 100, scratch=lambda *_: box[0])
    g = kpack.graph([b])
    assert any(isinstance(r, list) and r == [b] for r in gc.get_referents(g))
    box.append(g)
    ref = weakref.ref(g)
    del g, b, box
    gc.collect()
    assert ref() is None


def test_stats_and_graphs_give_every_field(fake, va):
    g = kpack.graph([va.bind(tensor(0), tensor(1), tensor(2), 100)])
    g.replay(stream=fake.stream_create())
    assert set(g.stats()) == {"graphs_built", "replays", "nodes_patched", "last_nodes_patched",
                              "last_launches_resolved", "eager_steps", "captured_steps", "scratch_bytes",
                              "pdl_fallbacks"}
    assert set(g.graphs()[0]) == {"signature", "nodes", "scratch_bytes", "build_us", "replays",
                                  "programmatic_edges", "pdl_fallback"}
    assert g.graphs()[0]["programmatic_edges"] == 0 and g.graphs()[0]["pdl_fallback"] == ""


@pytest.mark.parametrize("programmatic", [True, False])
def test_programmatic_edges_can_be_turned_off(fake, open_pack, programmatic):
    pdl = open_pack("testpack").pdl
    launches = [pdl[(2,)].bind(tensor(0), tensor(1), 2048),
                pdl[(2,)].bind(tensor(1), tensor(2), 2048)]
    g = kpack.graph(launches, programmatic_edges=programmatic)
    g.replay(stream=fake.stream_create())
    assert g.graphs()[0]["programmatic_edges"] == (1 if programmatic else 0)
    assert g.graphs()[0]["pdl_fallback"] == "" and g.stats()["pdl_fallbacks"] == 0
