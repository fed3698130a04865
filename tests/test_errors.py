"""Every error batchfold raises on purpose, checked by its message."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
import torch

import batchfold as bf


def test_shape_mismatch_names_the_users_line_and_the_op() -> None:
    lin = torch.nn.Linear(4, 2)

    def fn(x: list[float]) -> torch.Tensor:
        return lin(torch.tensor(x))  # the line the error must name

    line = fn.__code__.co_firstlineno + 1
    with pytest.raises(
        bf.ShapeError, match=rf"linear at .*test_errors.py:{line} \(in fn\)"
    ) as info:
        bf.batch_map(fn, [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0]])
    assert "float32[3]" in str(info.value)
    assert "instance 1" in "".join(getattr(info.value, "__notes__", []))


def test_lazy_value_used_after_batch_map_returned() -> None:
    saved = []
    bf.batch_map(lambda x: saved.append(torch.tensor(x) * 2), [1.0])
    with pytest.raises(bf.LazyValueError, match="after that batch_map call returned"):
        _ = saved[0] + 1
    with pytest.raises(bf.LazyValueError, match="after that batch_map call returned"):
        torch.tanh(saved[0])
    with pytest.raises(bf.LazyValueError, match="item"):
        saved[0].item()


def test_lazy_value_from_another_batch_map() -> None:
    outer = []

    def inner(x: float) -> torch.Tensor:
        return torch.tensor(x) + outer[0]

    bf.batch_map(lambda x: outer.append(torch.tensor(x)), [1.0])
    with pytest.raises(bf.LazyValueError):
        bf.batch_map(inner, [2.0])


def test_a_lazy_value_of_another_batch_map_returned_is_an_error() -> None:
    """Returned, it was read as the node of its id in this run's graph: another value."""
    outer: list[torch.Tensor] = []
    bf.batch_map(lambda x: outer.append(torch.tensor(x).exp()) or torch.tensor(x), [1.0, 2.0])

    def inner(x: float) -> torch.Tensor:
        h = torch.tensor(x)
        for _ in range(3):
            h = torch.tanh(h)
        return outer[1]

    with pytest.raises(bf.LazyValueError, match="return of a lazy value"):
        bf.batch_map(inner, [3.0, 4.0])


def test_a_result_in_a_subclass_of_list_is_refused() -> None:
    """It came back holding a lazy value that no later use could read, with no error."""

    class Bag(list):  # type: ignore[type-arg]
        pass

    with pytest.raises(bf.UnsupportedOpError, match="returned a Bag .a subclass of list."):
        bf.batch_map(lambda x: Bag([torch.tensor(x).exp()]), [1.0, 2.0])
    got = bf.batch_map(lambda x: [torch.tensor(x).exp()], [1.0, 2.0])  # a plain list is fine
    assert isinstance(got[0][0], torch.Tensor)


def test_mixing_devices_is_an_error() -> None:
    weight = torch.zeros(3, device="meta")
    with pytest.raises(bf.DeviceError, match=r"mul at .* mixes devices \['cpu', 'meta'\]"):
        bf.batch_map(lambda x: torch.tensor(x) * weight, [[1.0, 2.0, 3.0]])


def test_mixing_float_dtypes_is_an_error_not_a_cast() -> None:
    weight = torch.ones(3, dtype=torch.float64)
    with pytest.raises(bf.DtypeError, match=r"mixes dtypes \['torch.float32', 'torch.float64'\]"):
        bf.batch_map(lambda x: torch.tensor(x) + weight, [[1.0, 2.0, 3.0]])


def test_data_dependent_shapes_are_refused_clearly() -> None:
    with pytest.raises(bf.UnsupportedOpError, match="nonzero .* depends on per-instance values"):
        bf.batch_map(lambda x: torch.nonzero(torch.tensor(x)), [[1.0, 0.0]])


def test_non_tensor_results_cannot_be_recorded() -> None:
    with pytest.raises(bf.UnsupportedOpError, match="returns bool"):
        bf.batch_map(lambda x: torch.equal(torch.tensor(x), torch.tensor(x)), [[1.0]])


def test_exceptions_in_user_code_name_the_instance() -> None:
    def fn(x: float) -> torch.Tensor:
        if x > 1:
            raise KeyError("bad instance")
        return torch.tensor(x)

    with pytest.raises(KeyError) as info:
        bf.batch_map(fn, [0.0, 1.0, 2.0])
    assert "instance 2" in "".join(getattr(info.value, "__notes__", []))


# Local classes that still await ``from ..errors import ...`` in modules edited elsewhere;
# empty this once training/loop.py and cli.py import ConfigError and CommandLineError.
NOT_YET_MOVED: set[str] = set()


def test_every_error_class_is_a_batchfold_error_listed_in_batchfold_errors() -> None:
    import batchfold.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, bf.BatchfoldError) and cls.__doc__, name
        assert getattr(bf, name) is cls, f"batchfold.{name} is not exported"
        assert name in (errors.__doc__ or ""), f"batchfold.errors does not explain {name}"
    found = {}
    for info in pkgutil.walk_packages(bf.__path__, "batchfold."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and not issubclass(value, Warning)
                and value.__module__.startswith("batchfold")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    assert found  # the walk saw the package
    for where, cls in found.items():
        if where in NOT_YET_MOVED:
            assert cls.__name__ in errors.__all__, where
            continue
        assert cls.__module__ == "batchfold.errors", f"{where} is not defined in batchfold.errors"
        assert cls.__name__ in errors.__all__, f"{where} is not in batchfold.errors.__all__"


def test_errors_re_exported_where_they_are_raised_are_the_same_classes() -> None:
    from batchfold import blocks
    from batchfold.blocks import types
    from batchfold.data import conllu, molecule_features, molecules, sst

    assert blocks.BlockTypeError is types.BlockTypeError is bf.BlockTypeError
    assert blocks.BlockInputError is types.BlockInputError is bf.BlockInputError
    assert sst.SSTFormatError is bf.SSTFormatError
    assert issubclass(bf.SSTFormatError, ValueError)
    assert conllu.ConlluFormatError is bf.ConlluFormatError
    assert molecules.MoleculeFormatError is molecule_features.MoleculeFormatError
    assert molecules.MoleculeFormatError is bf.MoleculeFormatError
    assert issubclass(bf.ConfigError, ValueError) and issubclass(bf.GraphError, RuntimeError)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_an_index_out_of_range_is_eagers_error_naming_the_line(scheduler: str) -> None:
    emb = torch.nn.Embedding(5, 3)

    def fn(word: int) -> torch.Tensor:
        return emb(torch.tensor(word)).sum()  # the line the note names

    line = fn.__code__.co_firstlineno + 1
    with pytest.raises(IndexError, match="index out of range") as caught:
        bf.batch_map(fn, [1, 4, 7, 2], scheduler=scheduler)  # type: ignore[arg-type]
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert f"test_errors.py:{line}" in note and "row 2 of its batched step of 4" in note


def test_a_value_error_of_an_op_batched_by_vmap_is_eagers_error() -> None:
    def fn(m: list[list[float]]) -> torch.Tensor:
        return torch.linalg.cholesky(torch.tensor(m, dtype=torch.float64))

    good, bad = [[2.0, 0.0], [0.0, 3.0]], [[1.0, 2.0], [2.0, 1.0]]  # not positive-definite
    with pytest.raises(torch.linalg.LinAlgError) as caught:
        fn(bad)
    eager = str(caught.value)
    with pytest.raises(torch.linalg.LinAlgError) as caught:
        bf.batch_map(fn, [good, bad, good])
    assert (
        str(caught.value) == eager
        and "row 1 of its batched step of 3" in getattr(caught.value, "__notes__", [""])[0]
    )


def test_a_rule_that_fails_where_the_op_does_not_is_a_batching_rule_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchfold.lazy.kept import forget
    from batchfold.opbase import RULES, OpRule

    def broken(sig: object, inputs: object, n: int) -> torch.Tensor:
        raise RuntimeError("a broken rule")

    forget()  # no signature kept from earlier calls: the next ones look the rule up
    monkeypatch.setitem(RULES, torch.asinh, OpRule("broken", broken))
    with pytest.raises(
        bf.errors.BatchingRuleError, match="a broken rule.*no instance alone raises it"
    ):
        bf.batch_map(lambda x: torch.asinh(torch.tensor(x)), [0.5, 1.5])
    forget()


def test_an_index_out_of_range_in_a_packed_step_names_the_line() -> None:
    emb = torch.nn.Embedding(5, 3)

    def fn(words: list[int]) -> torch.Tensor:
        return emb(torch.tensor(words)).sum(0)  # sentences of different lengths: packed

    line = fn.__code__.co_firstlineno + 1
    with pytest.raises(IndexError, match="index out of range") as caught:
        bf.batch_map(fn, [[1, 2], [3, 9, 1], [0, 4]])
    assert f"test_errors.py:{line}" in "\n".join(getattr(caught.value, "__notes__", []))


def test_a_lazy_value_in_an_attribute_of_a_returned_object_is_refused() -> None:
    """It would come back lazy, and fail later at its first use, far from the cause."""

    class Box:
        def __init__(self, h: Any) -> None:
            self.h, self.n = h, 3

    layer = torch.nn.Linear(3, 3)
    with pytest.raises(
        bf.UnsupportedOpError, match="returned a Box holding a lazy value in its attribute 'h'"
    ):
        bf.batch_map(lambda x: Box(layer(torch.tensor(x))), [[1.0, 2.0, 3.0]])
    (box, out), _ = bf.batch_map(
        lambda x: (Box(None), layer(torch.tensor(x))), [[1.0, 2.0, 3.0]] * 2
    )
    assert isinstance(out, torch.Tensor) and box.n == 3  # objects without lazy values pass


def test_a_returned_generator_or_closure_over_a_lazy_value_is_refused() -> None:
    """A generator came back whose values were lazy when iterated, and a closure failed at
    its first call, far from the cause."""

    def rows(x: list[float]) -> Any:
        t = torch.tensor(x) * 2
        return (v for v in [t, t + 1])

    def later(x: list[float]) -> Any:
        t = torch.tensor(x) * 2
        return [lambda: t + 1]

    with pytest.raises(bf.UnsupportedOpError, match="returned a generator.*Return a list"):
        bf.batch_map(rows, [[1.0, 2.0]])
    with pytest.raises(bf.UnsupportedOpError, match="returned a function holding a lazy value"):
        bf.batch_map(later, [[1.0, 2.0]])
    (out, size), _ = bf.batch_map(lambda x: (torch.tensor(x) * 2, len), [[1.0], [2.0]])
    assert size is len and out.tolist() == [2.0]  # a function without lazy values passes


def test_an_item_of_an_outside_tensor_set_to_a_lazy_value_is_refused_as_a_write() -> None:
    """``W[0] = v`` met shape inference, which said setitem returns None."""
    outside = torch.zeros(3)

    def fn(i: float) -> torch.Tensor:
        outside[0] = torch.tensor(i) * 2
        return outside * 1

    with pytest.raises(bf.UnsupportedOpError, match="writes per-instance values into a tensor"):
        bf.batch_map(fn, [1.0, 2.0])
