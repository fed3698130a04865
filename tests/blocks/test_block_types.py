"""Types, their inference, and the errors for blocks that do not fit together."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

import batchfold as bf
from batchfold import ShapeError
from batchfold.blocks import (
    FC,
    RNN,
    AllOf,
    BlockInputError,
    BlockTypeError,
    Broadcast,
    BroadcastSequenceType,
    Concat,
    Embedding,
    Fold,
    ForwardDeclaration,
    Function,
    GetItem,
    Identity,
    InputTransform,
    Map,
    Metric,
    OneHotFromList,
    OneOf,
    PyObjectType,
    Record,
    Scalar,
    SequenceType,
    Sum,
    Tensor,
    TensorType,
    TupleType,
    Vector,
    VoidType,
    Zeros,
    Zip,
    compile,
)
from batchfold.blocks.types import canonical

pytestmark = pytest.mark.usefixtures("walks")  # every test: generated and closures

F32 = torch.float32


def test_types_compare_hash_print_and_canonicalize():
    v = TensorType((3,), F32)
    assert v == TensorType([3], F32) and hash(v) == hash(TensorType((3,), F32))  # type: ignore[arg-type]
    assert repr(TupleType(v, PyObjectType())) == (
        "TupleType(TensorType((3,), torch.float32), PyObjectType())"
    )
    assert canonical(SequenceType(TupleType(PyObjectType(), PyObjectType()))) == PyObjectType()
    assert canonical(BroadcastSequenceType(v)) == BroadcastSequenceType(v)
    with pytest.raises(ValueError, match="sizes >= 0"):
        TensorType((-1,), F32)


def test_output_types_are_inferred_through_composition():
    block = Record({"a": Map(Scalar(F32)), "b": GetItem(0) >> Vector(2, F32)})
    assert block.output_type() == TupleType(
        SequenceType(TensorType((), F32)), TensorType((2,), F32)
    )
    assert (Map(Scalar(F32)) >> Sum()).output_type() == TensorType((), F32)
    assert (Vector(4, F32) >> FC(4, 2)).output_type() == TensorType((2,), F32)
    assert (Scalar("int64") >> Embedding(5, 3)).output_type() == TensorType((3,), F32)
    assert Metric("m").output_type(TensorType((), F32)) == VoidType()


def test_repr_reads_like_the_constructor():
    block = Map(Vector(2, F32) >> Function(torch.nn.Linear(2, 3))) >> Sum()
    assert repr(block) == (
        "Pipe(Map(Pipe(Vector(2, torch.float32), Function(Linear(in_features=2, out_features=3, "
        "bias=True)))), Sum())"
    )
    assert repr(Record({"x": Identity()})) == "Record({'x': Identity()})"
    assert repr(Fold(Function(torch.add), Zeros(TensorType((), F32)))) == (
        "Fold(Function(torch.add), Zeros(TensorType((), torch.float32)))"
    )


def test_a_pipe_mismatch_names_both_blocks_both_types_and_where():
    message = (
        "Function(FC(3, 4, activation=relu), in_type=TensorType((3,), torch.float32)) at Pipe[1] "
        "expects TensorType((3,), torch.float32), got TensorType((), torch.float32) from "
        "Scalar(torch.float32) at Pipe[0]."
    )
    with pytest.raises(BlockTypeError, match=re.escape(message)):
        _ = Scalar(F32) >> FC(3, 4)
    with pytest.raises(TypeError, match=re.escape("Map(Identity()) at Pipe[1] expects a sequence")):
        _ = Vector(2, F32) >> Map(Identity())


def test_a_mismatch_found_at_compile_time_names_the_path_in_the_model():
    fc = FC(3, 4)
    block = Map(Identity() >> fc)  # Identity's type is only known once the input type is
    with pytest.raises(BlockTypeError) as error:
        compile(block)
    assert str(error.value).startswith("Function(FC(3, 4, activation=relu)")
    assert "at model.block[1] expects a tensor or a tuple of tensors, got PyObjectType() " in str(
        error.value
    )
    assert str(error.value).endswith("from Identity() at model.block[0].")


def test_other_type_errors_and_their_messages():
    with pytest.raises(BlockTypeError, match=r"at OneOf.cases\[1\] is to give TensorType\(\(\)"):
        _ = OneOf(lambda x: x, {0: Scalar(F32), 1: Vector(2, F32)})
    with pytest.raises(BlockTypeError, match="the type metric 'm' gets at AllOf"):
        _ = AllOf(Scalar(F32) >> Metric("m"), Vector(2, F32) >> Metric("m"))
    with pytest.raises(BlockTypeError, match=r"combine expects an input it can compute on"):
        _ = Map(Vector(2, F32)) >> Fold(Function(torch.add), Zeros(TensorType((3,), F32)))
    with pytest.raises(BlockTypeError, match=r"needs a cell with a declared in_type"):
        _ = Map(Scalar(F32)) >> RNN(Function(torch.add))
    with pytest.raises(BlockTypeError, match="must give tensors, tuples of them or sequences"):
        compile(InputTransform(str))
    with pytest.raises(BlockTypeError, match="shapes differ only in dim 0"):
        _ = Record((Vector(2, F32), Vector(2, "int64"))) >> Concat()
    unresolved = ForwardDeclaration(PyObjectType(), TensorType((), F32), name="tree")
    with pytest.raises(BlockTypeError, match=r"tree.* at tree needs resolve_to\(block\)"):
        compile(unresolved())
    with pytest.raises(BlockTypeError, match="to give TensorType\\(\\(\\), torch.float32\\), the"):
        unresolved.resolve_to(Vector(2, F32))
    assert unresolved.target is None  # a failed resolve_to leaves it unresolved


def test_bad_python_inputs_name_the_block_the_path_and_the_input():
    model = compile(Map(Scalar("int64")) >> Sum())
    message = (
        "Scalar(torch.int64) at model[0].block: expected integers of shape (), got 'a' (input 1)"
    )
    with pytest.raises(BlockInputError, match=re.escape(message)):
        model([[1], [2, "a"]])
    with pytest.raises(BlockInputError, match=r"at model\[0\]: expected a sequence, got 3"):
        model([3])
    keyed = compile(OneOf(lambda x: x[0], {"a": GetItem(1) >> Scalar(F32)}))
    with pytest.raises(BlockInputError, match=r"key 'b' has no case \(cases: 'a'\) \(input 0\)"):
        keyed([("b", 1.0)])
    with pytest.raises(BlockInputError, match=r"cannot read field 'x': KeyError"):
        compile(Record({"x": Scalar(F32)}))([{"y": 1.0}])


def test_an_error_raised_while_recording_notes_the_input():
    def check(x: Any) -> Any:
        if x == -1.0:
            raise ArithmeticError("negative")
        return x

    model = compile(InputTransform(check) >> Scalar(F32))
    with pytest.raises(ArithmeticError) as error:
        model([1.0, -1.0])
    assert getattr(error.value, "__notes__", None) == [
        "(raised while recording input 1 of the batch)"
    ]
    with pytest.raises(BlockInputError) as bad:  # names its input already: no note
        model(["a"])
    assert not hasattr(bad.value, "__notes__")


def test_an_empty_value_keeps_every_dim_of_its_type():
    """``Tensor([0, 3])`` given ``[]`` came back ``(0,)`` (``torch.tensor([])``), ``(2, 0)``
    for a batch of two, beside the declared ``(0, 3)``."""
    block = Tensor([0, 3])
    assert block.eval([]).shape == (0, 3)
    assert block.eval(np.zeros((0, 3))).shape == (0, 3)
    out, _ = compile(block)([[], torch.zeros(0, 3), np.zeros((0, 3))])
    assert out.shape == (3, 0, 3) and out.dtype == torch.get_default_dtype()


def test_an_unhashable_key_or_a_number_for_fields_names_the_block():
    """A ``OneOf`` key that is a list and a number given to a ``Record`` met a bare
    ``TypeError`` (unhashable; no ``len``) that named no block."""
    second = GetItem(1) >> Scalar(F32)
    pick = OneOf(lambda x: x[0], {"a": second, "b": second})
    with pytest.raises(BlockInputError, match=r"OneOf.*key \['a'\] has no case"):
        compile(pick)([("a", 1.0), (["a"], 2.0)])
    pair = Record((Scalar(F32), Scalar(F32)))
    with pytest.raises(BlockInputError, match=r"Record.*expected 2 fields, got 5 \(input 1\)"):
        compile(pair)([(1.0, 2.0), 5])
    assert pair.eval((1.0, 2.0))[1].item() == 2.0


@pytest.mark.parametrize(
    ("block", "batch"),
    [
        (Map(Scalar("int8")) >> Sum(), [[1], [1, 300]]),
        (Scalar("int64"), [1, 2**64]),
        (Tensor([2], "uint8"), [[1, 2], [3, -1]]),
    ],
)
def test_an_integer_out_of_its_dtypes_range_names_the_block(block: Any, batch: list[Any]) -> None:
    """It met PyTorch's bare overflow error when the batch's numbers were converted."""
    with pytest.raises(
        BlockInputError, match=r"expected integers in \[.*\] \(u?int\d+\).*\(input 1\)"
    ):
        compile(block)(batch)
    out, _ = compile(block)(batch[:1])
    assert out.dtype == block.output_type().dtype  # in range: as before


def test_unhashable_elements_bad_zips_and_a_wrong_declared_output_name_the_block() -> None:
    """A bare TypeError (unhashable; not iterable), a ValueError from ``min()`` and a
    "bug in batchfold's rule" named no block, or the wrong one."""
    with pytest.raises(BlockInputError, match=r"OneHotFromList.*expected an element, got \['b'\]"):
        compile(OneHotFromList(["a", "b"], strict=False))(["a", ["b"]])
    add = Map(Record((Scalar(F32), Scalar(F32))) >> Function(torch.add)) >> Sum()
    with pytest.raises(
        BlockInputError, match=r"Zip\(\) at .*expected a sequence, got 5 \(input 1\)"
    ):
        compile(Zip() >> add)([([1.0], [2.0]), (5, [1.0])])
    both = Record((Broadcast(), Broadcast())) >> Zip() >> add
    with pytest.raises(BlockInputError, match=r"Zip\(\) at .*not a Broadcast \(input 0\)"):
        compile(both)([(1.0, 2.0)])
    out, _ = compile(Zip() >> add)([([1.0, 2.0], [3.0, 4.0, 5.0])])
    assert out.tolist() == [10.0]
    declared = TensorType((2,), F32)
    first = Vector(2) >> Function(lambda x: x[:, :1], out_type=declared, name="first")
    with pytest.raises(ShapeError, match=r"first \(a Function block at model\[1\]\) returned"):
        compile(first)([[1.0, 2.0]])


def test_finding_a_functions_output_type_draws_nothing_from_the_generator():
    """The trial call on zeros ran dropout in training mode: a run resumed from a checkpoint
    compiled its blocks again and drew other masks than the run it continued."""
    drop = torch.nn.Dropout(0.5)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    compile(Vector(4) >> Function(lambda x: torch.nn.functional.dropout(x, 0.5, training=True)))
    compile(Vector(4) >> Function(drop))
    assert torch.equal(torch.rand(3), want)


def test_zeros_empty_batches_and_tensor_inputs_of_integer_blocks():
    """``Zeros`` (the sum of no items, an RNN's first state) crashed inside ``batch_map``; a
    padded output of an empty batch had no length dim; a float or out-of-range tensor given to
    an integer block was truncated or wrapped where the same number is refused."""
    total = Map(Scalar(F32)) >> Sum()
    assert [t.item() for t in bf.batch_map(lambda v: total.eval(v), [[], [1.0, 2.0]])] == [0, 3]
    out, _ = compile(Map(Vector(2)))([])
    assert tuple(out.values.shape) == (0, 0, 2)
    for block, value in [
        (Scalar("int64"), torch.tensor(2.7)),
        (Scalar("uint8"), torch.tensor(300)),
    ]:
        with pytest.raises(BlockInputError, match=r"expected integers in \[.*\], got a torch"):
            compile(block)([value])
    out, _ = compile(Scalar("int64"))([torch.tensor(3.0), torch.tensor(4, dtype=torch.int32)])
    assert out.tolist() == [3, 4]


def test_metrics_of_an_eval_inside_batch_map_are_one_tensor_as_outside():
    """They came back as a list of 0-d tensors inside, one stacked tensor outside."""
    block = Map(Vector(2) >> Metric("v"))
    inputs = [[], [[1.0, 2.0], [3.0, 4.0]]]
    inside = bf.batch_map(lambda x: block.eval(x)[1], inputs)
    for got, x in zip(inside, inputs, strict=True):
        want = block.eval(x)[1]
        assert isinstance(got["v"], torch.Tensor) and got["v"].shape == want["v"].shape
        torch.testing.assert_close(got["v"], want["v"])
