"""The graph (batchfold.graph): metas, signatures, nodes and depths, segments, lint and text."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import batchfold as bf
from batchfold.graph import OUT_BITS, Graph, Signature, Slot, TensorMeta

CPU = torch.device("cpu")
VEC = TensorMeta.of((3,), torch.float32, CPU)
PAIR = TensorMeta.of((2,), torch.float32, CPU)


def source(g: Graph, meta: TensorMeta = VEC, site: str = "t.py:1") -> Signature:
    """A source signature: nodes with no inputs whose values are their payloads."""
    key = ("source", meta)
    return g.lookup(key) or g.signature(
        key,
        func=torch.zeros,
        rule=None,
        name="zeros",
        out_metas=(meta,),
        site=site,
        source="tensor",
    )


def unary(g: Graph, name: str = "neg", site: str = "t.py:2") -> Signature:
    """A one-input, one-output signature on float32[3]."""
    key = (name, VEC)
    return g.lookup(key) or g.signature(
        key,
        func=getattr(torch, name),
        rule=None,
        name=name,
        template=((Slot(0),), {}),
        in_metas=(VEC,),
        out_metas=(VEC,),
        site=site,
    )


def test_metas_are_interned_and_pickle_to_the_same_object() -> None:
    meta = TensorMeta.of((2, 3), torch.float64, CPU)
    assert TensorMeta.of((2, 3), torch.float64, CPU) is meta
    assert TensorMeta.of((3, 2), torch.float64, CPU) is not meta
    assert pickle.loads(pickle.dumps(meta)) is meta
    assert repr(meta) == "float64[2, 3]" and meta.size == torch.Size([2, 3])


def test_signatures_are_found_by_their_full_key_not_by_hash() -> None:
    class Key:
        """Keys that all hash alike; only equal ones are the same key."""

        def __init__(self, n: int) -> None:
            self.n = n

        def __hash__(self) -> int:
            return 0

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Key) and other.n == self.n

    g = Graph()
    sig = g.signature(
        Key(1), func=torch.neg, rule=None, name="neg", in_metas=(VEC,), out_metas=(VEC,)
    )
    assert g.lookup(Key(1)) is sig
    assert g.lookup(Key(2)) is None
    assert [s.id for s in g.signatures] == [0]
    assert repr(sig) == "Signature(0, neg(float32[3]) -> float32[3])"


def test_nodes_get_value_ids_and_depths_in_recording_order() -> None:
    g = Graph()
    a = g.add(source(g), (), instance=0, payload=torch.zeros(3))
    b = g.add(source(g), (), instance=1, payload=torch.ones(3))
    c = g.add(unary(g), (a,), instance=0)
    d = g.add(unary(g, "exp"), (c,), instance=0)
    e = g.add(unary(g), (b,), instance=1)
    assert [v >> OUT_BITS for v in (a, b, c, d, e)] == [0, 1, 2, 3, 4]
    assert g.pending == 5 and g.node_depth == [0, 0, 1, 2, 1]
    sig_of, depth, members = g.pending_arrays()
    assert sig_of.tolist() == [0, 0, 1, 2, 1] and depth.tolist() == [0, 0, 1, 2, 1]
    assert {k: v.tolist() for k, v in members.items()} == {0: [0, 1], 1: [2, 4], 2: [3]}
    assert g.pending_of[unary(g).id].inputs == [a, b]
    assert g.pending_of[unary(g).id].instances == [0, 1]
    assert len(g.pending_of[source(g).id].payloads) == 2


def test_a_new_segment_numbers_on_and_counts_run_values_as_depth_minus_one() -> None:
    g = Graph()
    a = g.add(source(g), (), instance=0, payload=torch.zeros(3))
    b = g.add(unary(g), (a,), instance=0)
    g.clear_pending()  # the segment ran
    assert g.node_base == 2 and g.pending == 0
    assert all(not p.nodes and not p.inputs and not p.instances for p in g.pending_of)
    c = g.add(unary(g), (b,), instance=0)  # reads a value of the earlier segment
    d = g.add(unary(g), (c,), instance=0)
    assert (c >> OUT_BITS, d >> OUT_BITS) == (2, 3)
    assert g.node_depth == [0, 1]
    sig_of, _, members = g.pending_arrays()  # numbered from the segment's first node
    assert sig_of.tolist() == [1, 1] and members[1].tolist() == [0, 1]
    g.lint()


def test_lint_and_text_of_a_recorded_batch() -> None:
    lin = torch.nn.Linear(2, 4)
    rec = bf.lazy.Recorder()
    with rec:
        for i in range(2):
            rec.instance = i
            x = torch.tensor([1.0, float(i)])
            h = torch.tanh(lin(x))
            left, right = h.chunk(2)
            if i == 1:  # the instances differ in structure
                h = h * torch.cat([right, left])
            _ = h.sum()
    rec.graph.lint()
    assert str(rec.graph).splitlines() == [
        "node 0  tensor() -> float32[2]  depth 0  instance 0",
        "node 1  linear(v0.0) -> float32[4]  depth 1  instance 0",
        "node 2  tanh(v1.0) -> float32[4]  depth 2  instance 0",
        "node 3  chunk(v2.0) -> float32[2], float32[2]  depth 3  instance 0",
        "node 4  sum(v2.0) -> float32[]  depth 3  instance 0",
        "node 5  tensor() -> float32[2]  depth 0  instance 1",
        "node 6  linear(v5.0) -> float32[4]  depth 1  instance 1",
        "node 7  tanh(v6.0) -> float32[4]  depth 2  instance 1",
        "node 8  chunk(v7.0) -> float32[2], float32[2]  depth 3  instance 1",
        "node 9  cat(v8.1, v8.0) -> float32[4]  depth 4  instance 1",
        "node 10  mul(v7.0, v9.0) -> float32[4]  depth 5  instance 1",
        "node 11  sum(v10.0) -> float32[]  depth 6  instance 1",
    ]


def random_program(rng: random.Random, lin: torch.nn.Linear, x: list[float]) -> torch.Tensor:
    """Plain per-instance code: a random walk over a few registers of float32[4]."""
    regs = [torch.tensor(x), torch.tensor(x).sin(), torch.zeros(4)]
    for _ in range(rng.randint(1, 15)):
        a, b = rng.randrange(3), rng.randrange(3)
        kind = rng.randrange(8)
        if kind == 0:
            regs[a] = torch.tanh(regs[b])
        elif kind == 1:
            regs[a] = regs[a] + regs[b] * 0.5
        elif kind == 2:
            regs[a] = F.linear(regs[b], lin.weight, lin.bias)
        elif kind == 3:
            first, second = regs[b].chunk(2)
            regs[a] = torch.cat([second, first * regs[a][:2]])
        elif kind == 4:
            regs[a] = regs[b] - regs[b].sum()
        elif kind == 5:
            regs[a] = torch.stack([regs[a], regs[b]]).mean(0)
        elif kind == 6:
            regs[a] = regs[b] @ lin.weight.t()
        else:
            regs[a] = regs[a].clone()
            regs[a][rng.randrange(4)] = regs[b].sum()
    return regs[0] + regs[1] + regs[2]


@pytest.mark.parametrize("seed", range(6))
def test_recorded_random_programs_lint(seed: int) -> None:
    rng = random.Random(seed)
    lin = torch.nn.Linear(4, 4)
    rec = bf.lazy.Recorder()
    with rec:
        results = []
        for i in range(rng.randint(1, 6)):
            rec.instance = i
            program = random.Random(10 * seed + rng.randrange(2))  # some instances share code
            results.append(random_program(program, lin, [rng.random() for _ in range(4)]))
        rec.graph.lint()
        assert rec.graph.pending > 0
        rec.flush()  # run the segment; later nodes read its values
        for i, y in enumerate(results):
            rec.instance = i
            results[i] = random_program(random.Random(seed), lin, [0.5] * 4) * y
        rec.graph.lint()
        assert rec.graph.node_base > 0 and rec.graph.pending > 0


def _reads_a_later_node(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[n.id].inputs[0] = vs[3]


def _reads_itself(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[n.id].inputs[1] = vs[2]


def _missing_input(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[n.id].inputs.pop()


def _missing_instance(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[n.id].instances.pop()


def _extra_payload(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[s.id].payloads.append(torch.zeros(3))


def _no_such_output(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[n.id].inputs[0] = vs[0] + 1


def _wrong_meta(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    pairs = g.signature(
        "p", func=torch.neg, rule=None, name="neg", in_metas=(PAIR,), out_metas=(PAIR,)
    )
    g.add(pairs, (vs[0],), instance=1)  # expects float32[2], reads a float32[3]


def _wrong_depth(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.node_depth[2] = 0


def _orphan_node(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.node_depth.append(0)


def _node_twice(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[s.id].nodes[1] = 0


def _node_not_pending(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[s.id].nodes[1] = 7


def _negative_instance(g: Graph, s: Signature, n: Signature, vs: list[int]) -> None:
    g.pending_of[s.id].instances[0] = -1


BREAKAGES: dict[str, tuple[Callable[[Graph, Signature, Signature, list[int]], None], str]] = {
    "reads a later node": (_reads_a_later_node, r"node 2 reads v3\.0, .* not an earlier node"),
    "reads itself": (_reads_itself, r"node 2 reads v2\.0, .* not an earlier node"),
    "missing input": (_missing_input, r"3 input value ids for 2 nodes of 2"),
    "missing instance": (_missing_instance, r"1 instance ids for 2 nodes"),
    "extra payload": (_extra_payload, r"3 payloads for 2 nodes"),
    "no such output": (_no_such_output, r"node 2 reads v0\.1, but .* has 1 output"),
    "wrong meta": (_wrong_meta, r"node 4 input 0 expects float32\[2\], but v0\.0 .* float32\[3\]"),
    "wrong depth": (_wrong_depth, r"node 2 has depth 0, its inputs give 1"),
    "orphan node": (_orphan_node, r"pending node 4 belongs to no signature"),
    "node twice": (_node_twice, r"node 0 also belongs to"),
    "node not pending": (_node_not_pending, r"node 7 is not pending \(pending: 0\.\.3\)"),
    "negative instance": (_negative_instance, r"node 0 has instance -1"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_graph_raises_graph_error(breakage: str) -> None:
    g = Graph()
    src = source(g)
    add = g.signature(
        "add",
        func=torch.add,
        rule=None,
        name="add",
        template=((Slot(0), Slot(1)), {}),
        in_metas=(VEC, VEC),
        out_metas=(VEC,),
        site="t.py:5",
    )
    vs = [g.add(src, (), instance=i, payload=torch.zeros(3)) for i in range(2)]
    vs.append(g.add(add, (vs[0], vs[1]), instance=0))
    vs.append(g.add(add, (vs[2], vs[1]), instance=0))
    g.lint()  # well formed before it is broken
    damage, message = BREAKAGES[breakage]
    damage(g, src, add, vs)
    with pytest.raises(bf.GraphError, match=message) as info:
        g.lint()
    assert isinstance(info.value, bf.BatchfoldError) and isinstance(info.value, RuntimeError)
    if breakage not in ("orphan node", "wrong meta"):
        assert "(recorded at t.py:" in str(info.value)  # names the signature and its site


def test_lint_raises_under_python_dash_o() -> None:
    code = (
        "import torch\n"
        "from batchfold.graph import Graph, Slot, TensorMeta\n"
        "meta = TensorMeta.of((1,), torch.float32, torch.device('cpu'))\n"
        "g = Graph()\n"
        "c = g.signature('c', func=torch.zeros, rule=None, name='zeros', out_metas=(meta,))\n"
        "n = g.signature('n', func=torch.neg, rule=None, name='neg', in_metas=(meta,),\n"
        "                out_metas=(meta,))\n"
        "v = g.add(n, (g.add(c, (), instance=0),), instance=0)\n"
        "g.pending_of[n.id].inputs[0] = v\n"
        "g.lint()\n"
    )
    src = Path(__file__).parents[1] / "src"
    done = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert done.returncode == 1
    assert "batchfold.errors.GraphError" in done.stderr, done.stderr


def test_pending_arrays_are_int64() -> None:
    g = Graph()
    g.add(source(g), (), instance=0, payload=torch.zeros(3))
    arrays = g.pending_arrays()
    assert arrays[0].dtype == np.int64 and arrays[1].dtype == np.int64
    assert all(m.dtype == np.int64 for m in arrays[2].values())
