"""Every error batchfold raises on purpose, checked by its message."""

from __future__ import annotations

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


def test_mixing_devices_is_an_error() -> None:
    weight = torch.zeros(3, device="meta")
    with pytest.raises(bf.DeviceError, match=r"mul at .* mixes devices \['cpu', 'meta'\]"):
        bf.batch_map(lambda x: torch.tensor(x) * weight, [[1.0, 2.0, 3.0]])


def test_mixing_float_dtypes_is_an_error_not_a_cast() -> None:
    weight = torch.ones(3, dtype=torch.float64)
    with pytest.raises(bf.DtypeError, match=r"mixes dtypes \['torch.float32', 'torch.float64'\]"):
        bf.batch_map(lambda x: torch.tensor(x) + weight, [[1.0, 2.0, 3.0]])


def test_data_dependent_shapes_are_refused_clearly() -> None:
    with pytest.raises(bf.ShapeError, match="nonzero"):
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
