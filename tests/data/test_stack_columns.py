"""iter_torch_batches(stack_columns=...): numeric columns handed out as one (rows, columns)
tensor per group, sliced from a block stacked once; the errors; through a mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import phalanx.data as pdata


def table(rows: int = 1000, columns: int = 6) -> dict[str, np.ndarray]:
    data = {f"c{i}": np.arange(rows, dtype=np.float32) * 10 + i for i in range(columns)}
    return {**data, "label": np.arange(rows, dtype=np.int64)}


def test_a_group_of_columns_is_one_row_major_tensor_and_the_rest_stay_columns():
    data = table()
    ds = pdata.from_numpy(data)
    names = [f"c{i}" for i in range(6)]
    batches = list(
        ds.iter_torch_batches(batch_size=64, device="cpu", stack_columns={"x": names[::-1]})
    )
    assert list(batches[0]) == ["label", "x"]
    x = torch.cat([b["x"] for b in batches])
    expected = np.stack([data[n] for n in names[::-1]], axis=1)
    assert x.shape == (1000, 6) and np.array_equal(x.numpy(), expected)
    assert batches[0]["x"].is_contiguous()
    assert torch.equal(torch.cat([b["label"] for b in batches]), torch.arange(1000))
    # a dtype for the stacked tensor by its name
    (first, *_) = ds.iter_torch_batches(
        batch_size=8, device="cpu", stack_columns={"x": names}, dtypes={"x": torch.float64}
    )
    assert first["x"].dtype == torch.float64


def test_stacking_works_through_a_mix():
    a, b = pdata.from_numpy(table(300)), pdata.from_numpy(table(100))
    ds = a.mix(b, weights=[0.75, 0.25])
    batches = list(ds.iter_torch_batches(batch_size=40, device="cpu", stack_columns={"x": ["c0"]}))
    assert sum(len(b["x"]) for b in batches) == 400
    assert batches[0]["x"].shape == (40, 1)


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ({"x": ["nope"]}, "does not have"),
        ({"x": ["c0"], "y": ["c0"]}, "in both 'x' and 'y'"),
        ({"c1": ["c0"]}, "is a column of the data already"),
        ({"x": []}, "non-empty list"),
        (["c0"], "use a dict"),
    ],
)
def test_bad_stack_columns_say_what_to_change(stack, message):
    ds = pdata.from_numpy(table(10))
    with pytest.raises(ValueError, match=message):
        ds.iter_torch_batches(batch_size=4, stack_columns=stack)


def test_only_numbers_stack():
    ds = pdata.from_items([{"s": "a", "v": 1.0}])
    with pytest.raises(ValueError, match="not a number"):
        ds.iter_torch_batches(batch_size=4, stack_columns={"x": ["s", "v"]})


def test_a_mix_gives_the_same_rows_as_torch_batches_as_numpy_batches():
    a, b, c = (pdata.from_numpy(table(n)) for n in (500, 300, 200))
    ds = a.mix(b, c, weights=[0.5, 0.3, 0.2])
    arrays = list(ds.iter_batches(batch_size=30))
    tensors = list(ds.iter_torch_batches(batch_size=30, device="cpu"))
    stacked = list(ds.iter_torch_batches(batch_size=30, device="cpu", stack_columns={"x": ["c2"]}))
    assert len(arrays) == len(tensors) == len(stacked)
    for x, t, s in zip(arrays, tensors, stacked):
        assert np.array_equal(x["label"], t["label"].numpy())
        assert np.array_equal(x["c2"], s["x"][:, 0].numpy())
