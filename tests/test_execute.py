"""The executor (batchfold.execute): Executor.run, gathers and fanouts, values, fallbacks, checks.

Most plans here are built by hand, so each test pins what the executor does with a plan,
whatever the scheduler would have made.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.errors import BatchingRuleError, ShapeError
from batchfold.execute import Executor
from batchfold.graph import OUT_BITS, Graph, Signature, Slot, TensorMeta
from batchfold.ops import RULES, VMAP, OpRule
from batchfold.schedule import UNBOUND, Fanout, Gather, Plan, Step, schedule
from batchfold.step_calls import Fallbacks, run_op
from reference import assert_matches_eager

CPU = torch.device("cpu")
F64 = torch.float64
PAIR = TensorMeta.of((2,), F64, CPU)
ONE = TensorMeta.of((1,), F64, CPU)


def op(
    g: Graph,
    func: Any,
    ins: tuple[TensorMeta, ...],
    outs: tuple[TensorMeta, ...] = (PAIR,),
    rule: OpRule | None = None,
    template: tuple[Any, Any] | None = None,
    source: str | None = None,
    ref: Any = None,
) -> Signature:
    """A signature of ``func`` on per-instance inputs ``ins``, batched by ``rule``."""
    template = template or (tuple(Slot(i) for i in range(len(ins))), {})
    name = getattr(func, "__name__", "f")
    rule = rule or RULES.get(func, VMAP)
    multi = tuple if len(outs) > 1 else None
    return g.signature(
        (name, len(g.signatures)),
        func=func,
        rule=rule,
        name=name,
        template=template,
        in_metas=ins,
        out_metas=outs,
        multi=multi,
        source=source,
        ref=ref,
    )


def v(node: int, output: int = 0) -> int:
    """The value id of output ``output`` of node ``node``."""
    return node << OUT_BITS | output


def hand_built_plan(base: torch.Tensor, refs: bool = False, source: str = "tensor") -> Plan:
    """Four sources, a fanout to two readers, a gather of slice and rows in another order.

    Nodes 0-3 are the rows of ``base``; 4, 5 = -base[3], -base[1]; 6, 7 = exp(base[0]),
    exp(base[2]); 8, 9, 10 = node 4 + node 7, base[1] + node 6, base[2] + node 7; 11, 12, 13
    are the chunks of 8, 9, 10.
    """
    g = Graph()
    ref = iter(range(5)) if refs else iter([None] * 5)  # ``refs``: each signature has a ref
    src = op(g, torch.zeros, (), source=source, ref=next(ref))
    neg, exp = op(g, torch.neg, (PAIR,), ref=next(ref)), op(g, torch.exp, (PAIR,), ref=next(ref))
    add = op(g, torch.add, (PAIR, PAIR), ref=next(ref))
    chunk = op(g, torch.chunk, (PAIR,), (ONE, ONE), template=((Slot(0), 2), {}), ref=next(ref))
    nodes, node_row = np.arange(14), np.array([0, 1, 2, 3, 0, 1, 0, 1, 0, 1, 2, 0, 1, 2])
    steps = [
        Step(
            0,
            src,
            nodes[0:4],
            (),
            (Fanout(0, np.array([3, 1, 0, 2]), (2, 2)),),
            list(base.unbind(0)),
        ),
        Step(1, neg, nodes[4:6], (Gather(((0, 0, 0),)),)),  # fanout chunk 0
        Step(2, exp, nodes[6:8], (Gather(((0, 0, 1),)),)),  # fanout chunk 1
        Step(
            3,
            add,
            nodes[8:11],
            (
                Gather(((0, 0, 1, 3), (1, 0, np.array([0]))), order=np.array([2, 0, 1])),
                Gather(((2, 0, np.array([1, 0, 1])),)),
            ),
        ),
        Step(4, chunk, nodes[11:14], (Gather(((3, 0, 0, 3),)),)),
    ]
    node_step = np.array([0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4])
    return Plan(steps, 0, node_step, node_row)


def by_hand(base: torch.Tensor) -> dict[int, torch.Tensor]:
    """What every value of :func:`hand_built_plan` holds, computed one at a time."""
    want = {v(i): base[i] for i in range(4)}
    want[v(4)], want[v(5)] = -base[3], -base[1]
    want[v(6)], want[v(7)] = base[0].exp(), base[2].exp()
    want[v(8)] = want[v(4)] + want[v(7)]
    want[v(9)] = base[1] + want[v(6)]
    want[v(10)] = base[2] + want[v(7)]
    for node in (11, 12, 13):
        want[v(node, 0)], want[v(node, 1)] = want[v(node - 3)].chunk(2)
    return want


def test_store_runs_a_plan_through_fanouts_slices_rows_and_orders() -> None:
    base = torch.randn(4, 2, dtype=F64)
    store = Executor()
    store.run(hand_built_plan(base))
    assert len(store.outputs) == 5 and store.fallbacks.counts == Counter()
    assert [c.shape[0] for c in store.chunks[0, 0]] == [2, 2]  # the fanout, split for readers
    for vid, want in by_hand(base).items():
        torch.testing.assert_close(store.value(vid), want, rtol=0, atol=0)
    node_step, node_row = store.locations
    assert node_step.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4]
    assert node_row.tolist()[8:11] == [0, 1, 2]


@pytest.mark.parametrize("source", ["tensor", "constant"])
def test_a_plan_pickles_by_ref_and_runs_only_once_bound_again(source: str) -> None:
    base = torch.randn(4, 2, dtype=F64)
    plan = hand_built_plan(base, refs=True, source=source)
    back = pickle.loads(pickle.dumps(plan))
    assert [s.sig.id for s in back.steps] == [UNBOUND] * 5
    assert [s.sig.ref for s in back.steps] == [0, 1, 2, 3, 4]
    assert [s.sig.name for s in back.steps] == [s.sig.name for s in plan.steps]
    assert (back.steps[0].payloads is None) == (source == "constant")  # constants stay home
    with pytest.raises(ValueError, match=r"step 0 \(zeros\) comes from a pickled plan"):
        Executor().run(back)
    by_ref = {s.sig.ref: s.sig for s in plan.steps}
    # a tensor source's payloads come back with the plan; a front end supplies a constant's
    source_payloads = back.steps[0].payloads if source == "tensor" else list(base.unbind(0))
    bound = Plan(
        [
            dataclasses.replace(
                s, sig=by_ref[s.sig.ref], payloads=source_payloads if s.index == 0 else None
            )
            for s in back.steps
        ],
        back.node_base,
        back.node_step,
        back.node_row,
    )
    store = Executor()
    store.run(bound)
    for vid, want in by_hand(base).items():
        torch.testing.assert_close(store.value(vid), want, rtol=0, atol=0)


def test_a_plan_with_a_signature_without_ref_refuses_to_pickle() -> None:
    plan = hand_built_plan(torch.randn(4, 2, dtype=F64))
    with pytest.raises(TypeError, match=r"step 0 \(zeros.*runs only in the process"):
        pickle.dumps(plan)


def test_rows_stack_values_of_one_shape_in_the_order_given() -> None:
    base = torch.randn(4, 2, dtype=F64)
    store = Executor()
    store.run(hand_built_plan(base))
    want = by_hand(base)
    pairs = [v(node) for node in range(11)]  # every [2] value: sources, neg, exp, add
    for ids in (pairs, pairs[::-1], [v(9), v(0), v(8), v(1), v(9)], [v(4), v(5)], [v(6)]):
        got = store.rows(np.asarray(ids, dtype=np.int64))
        torch.testing.assert_close(got, torch.stack([want[i] for i in ids]), rtol=0, atol=0)


def test_values_equal_value_in_any_order_and_carry_gradients() -> None:
    base = torch.randn(4, 2, dtype=F64, requires_grad=True)
    store = Executor()
    store.run(hand_built_plan(base))
    want = by_hand(base)
    vids = [v(13, 1), v(8), v(2), v(11, 0), v(13, 1), v(5), v(9), v(12, 0), v(0)]
    got = store.values(vids)
    assert len(got) == len(vids)
    for vid, tensor in zip(vids, got, strict=True):
        torch.testing.assert_close(tensor, store.value(vid), rtol=0, atol=0)
        torch.testing.assert_close(tensor, want[vid], rtol=0, atol=0)
    weights = torch.arange(1.0, len(vids) + 1, dtype=F64)
    loss = (weights * torch.stack([t.sin().sum() for t in got])).sum()
    eager = (weights * torch.stack([want[vid].sin().sum() for vid in vids])).sum()
    (grad,) = torch.autograd.grad(loss, base)
    (eager_grad,) = torch.autograd.grad(eager, base)
    torch.testing.assert_close(grad, eager_grad)


def test_values_of_one_step_output_are_one_gather() -> None:
    base = torch.randn(4, 2, dtype=F64)
    store = Executor()
    store.run(hand_built_plan(base))
    calls: list[str] = []

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
            calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Count():
        store.values([v(3), v(0), v(2), v(1), v(8), v(10)])  # two step outputs
    assert calls.count("index_select") == 2


def test_store_runs_segment_after_segment() -> None:
    g = Graph()
    src = op(g, torch.zeros, (), source="tensor")
    tanh = op(g, torch.tanh, (PAIR,))
    mul = op(g, torch.mul, (PAIR, PAIR))
    rows = torch.randn(3, 2, dtype=F64)
    first = [g.add(tanh, (g.add(src, (), i, rows[i]),), i) for i in range(3)]
    store = Executor()
    store.run(schedule(g))
    g.clear_pending()
    second = [g.add(mul, (first[i], first[2 - i]), i) for i in range(3)]  # earlier values
    steps_so_far = len(store.outputs)
    plan = schedule(g, "depth", steps_so_far, store.locations)
    assert plan.node_base == 6 and plan.steps[0].index == steps_so_far
    store.run(plan)
    assert len(store.node_step) == 9
    for i, tensor in enumerate(store.values(second + first)):
        want = rows[i].tanh() * rows[2 - i].tanh() if i < 3 else rows[i - 3].tanh()
        torch.testing.assert_close(tensor, want)


def _counts_once_per_instance(x: torch.Tensor) -> torch.Tensor:
    return x * float(x.sum())  # reads a value: vmap cannot batch it


def test_an_op_vmap_cannot_batch_falls_back_to_a_loop_and_both_are_counted() -> None:
    g = Graph()
    sig = op(g, _counts_once_per_instance, (PAIR,), rule=VMAP)
    x = torch.randn(5, 2, dtype=F64)
    fallbacks = Fallbacks()
    out = run_op(sig, [x], 5, fallbacks)
    torch.testing.assert_close(out[0], torch.stack([_counts_once_per_instance(r) for r in x]))
    assert sig in fallbacks.looped and sig.rule is VMAP  # loops from now on; sig unchanged
    assert fallbacks.counts == {"_counts_once_per_instance (loop)": 5}
    run_op(sig, [x[:2]], 2, fallbacks)
    assert fallbacks.counts == {"_counts_once_per_instance (loop)": 7}
    indices = TensorMeta.of((2,), torch.int64, CPU)
    vmapped = op(g, torch.sort, (PAIR,), (PAIR, indices), rule=VMAP)
    run_op(vmapped, [x], 5, fallbacks)
    assert vmapped.id not in fallbacks.looped and fallbacks.counts["sort (vmap)"] == 5


def test_rules_run_batched_and_fallbacks_are_counted() -> None:
    inputs = [torch.randn(4, 3).tolist() for _ in range(5)]
    _, stats = bf.batch_map(lambda x: torch.tanh(torch.tensor(x)), inputs, return_stats=True)
    assert stats.fallbacks == {}
    _, stats = bf.batch_map(lambda x: torch.sort(torch.tensor(x)).values, inputs, return_stats=True)
    assert stats.fallbacks == {"sort (vmap)": 5}


@pytest.mark.usefixtures("float64")
def test_op_vmap_cannot_batch_runs_once_per_instance() -> None:
    # lstm_cell with per-instance weights has no vmap rule: it must fall back to a loop
    def fn(x: list[list[float]]) -> torch.Tensor:
        w = torch.tensor(x)  # [4, 3]
        h = torch.zeros(1, 1)
        return torch.lstm_cell(torch.ones(1, 3), (h, h), w, torch.ones(4, 1))[0]

    inputs = [torch.randn(4, 3).tolist() for _ in range(3)]
    stats = assert_matches_eager(fn, inputs)
    assert stats.fallbacks == {"lstm_cell (loop)": 3}


@pytest.mark.usefixtures("float64")
def test_vmap_and_loop_fallbacks_in_one_batch_are_both_counted_in_stats() -> None:
    shared = nn.Linear(3, 3).double()

    def fn(x: list[list[float]]) -> Any:
        w = torch.tensor(x)  # [4, 3]: per-instance weights, which only a loop can batch
        h = torch.zeros(1, 1)
        looped = torch.lstm_cell(torch.ones(1, 3), (h, h), w, torch.ones(4, 1))[0]
        vmapped = torch.sort(shared(w), dim=1).values  # sort has no rule: vmap
        return looped.sum() + vmapped

    inputs = [torch.randn(4, 3).tolist() for _ in range(4)]
    stats = assert_matches_eager(fn, inputs, shared)
    assert stats.fallbacks == {"lstm_cell (loop)": 4, "sort (vmap)": 4}
    assert stats.plan is not None
    rules = {step.sig.name: step.sig.rule for step in stats.plan.steps}
    assert rules["lstm_cell"] is VMAP and rules["sort"] is VMAP  # the loop is the executor's
    assert "no batching rule (vmap or per instance): lstm_cell (loop) x4, sort (vmap) x4" in str(
        stats
    )


def test_a_failing_batching_rule_is_reported_as_a_batchfold_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(sig: Any, inputs: list[torch.Tensor], n: int) -> Any:
        raise IndexError("rule broke")

    monkeypatch.setitem(RULES, torch.tanh, OpRule("broken", broken))
    with pytest.raises(BatchingRuleError, match="bug in batchfold's rule"):
        bf.batch_map(lambda x: torch.tanh(torch.tensor(x)), [[1.0], [2.0]])


def test_a_rule_that_returns_the_wrong_shape_is_a_batching_rule_error() -> None:
    g = Graph()
    sig = op(g, torch.neg, (PAIR,), rule=OpRule("bad", lambda s, xs, n: xs[0][:, :1]))
    with pytest.raises(
        BatchingRuleError, match=r"rule bad of neg .* expected torch.float64 \(3, 2\)"
    ):
        run_op(sig, [torch.zeros(3, 2, dtype=F64)], 3, Fallbacks())


@pytest.mark.parametrize("reduce", [lambda x: x.sum(0), lambda x: x.sum()])
def test_a_batched_function_of_the_wrong_shape_is_the_users_shape_error(reduce: Any) -> None:
    wrong = bf.function(reduce, batched=True)  # sums over the batch, not per row: found when
    with pytest.raises(ShapeError, match=r"takes a batch, but on 2 rows it gives"):  # recorded
        bf.batch_map(lambda x: wrong(torch.tensor(x)), [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("mode", [0, 1])
def test_a_step_runs_in_the_grad_mode_its_nodes_were_recorded_in(mode: int) -> None:
    g = Graph()
    sig = op(g, torch.tanh, (PAIR,))
    sig.grad = mode
    x = torch.randn(3, 2, dtype=F64, requires_grad=True)
    with torch.set_grad_enabled(not mode):
        (out,) = run_op(sig, [x], 3, Fallbacks())
    assert out.requires_grad == bool(mode)


def test_a_vmap_fallback_shows_no_warning_of_pytorch_about_missing_batching_rules() -> None:
    """The step is counted in the statistics; PyTorch's warning asks to file an issue with it."""
    import warnings

    import torch.nn.functional as F

    def attend(x: Any) -> torch.Tensor:
        t = torch.tensor(x)
        return F.scaled_dot_product_attention(t, t, t)

    xs = [torch.randn(1, 2, 5, 8).tolist() for _ in range(3)]  # heads: the flash kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs, stats = bf.batch_map(attend, xs, return_stats=True)
    assert "scaled_dot_product_attention (vmap)" in stats.fallbacks
    assert not [w for w in caught if "batching rule" in str(w.message)]
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, attend(x))


def test_a_function_vmap_cannot_run_falls_back_to_one_call_per_instance() -> None:
    """``bf.function(fn)`` batches ``fn`` with vmap; one that branches on a value or reads one
    into Python (valid eagerly) met a BatchingRuleError, where an op without a rule of its own
    falls back to one call per instance, counted in the statistics."""
    layer = nn.Linear(4, 4).double()

    @bf.function
    def branching(h: torch.Tensor) -> torch.Tensor:
        return h * 2 if h.sum() > 0 else h - 1

    def fn(x: list[float]) -> torch.Tensor:
        return branching(layer(torch.tensor(x, dtype=torch.float64)))

    xs = [torch.randn(4).tolist() for _ in range(5)]
    outs, stats = bf.batch_map(fn, xs, return_stats=True)
    assert stats.fallbacks == {"branching (loop)": 5}
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, fn(x))
