"""Torch batches (imported only by ``iter_torch_batches``).

Without a ``collate_fn``, blocks of rows are turned into tensors once, in the prefetch thread:
the 1-D numeric columns of one dtype are stacked into one ``(columns, rows)`` tensor, so a batch
is one slice and one ``unbind`` however many columns there are (a batch of 32 rows of 100
columns costs about as much as slicing 100 numpy arrays).

With a CUDA ``device``, each block goes to the GPU whole, in the prefetch thread (see
``_staging``): one pinned host copy and one non-blocking copy on a side stream per block, so the
next blocks travel while the current batch trains, and a batch is a slice of GPU memory. On the
CPU nothing is staged: tensors share the memory of the stacked block, as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from phalanx._devices import torch_devices
from phalanx.data._batching import BlockOps, arrow_to_numpy, as_numpy
from phalanx.data._describe import describe_value, shorten
from phalanx.data._mix_blocks import MixedRows
from phalanx.data._staging import CudaFeed, Part

__all__ = ["TensorBlock", "TensorOps", "collate_format", "resolve_device", "to_device"]


def resolve_device(device: Any) -> torch.device:
    """``"auto"``: this worker's device inside a training function (its GPU, or the CPU)."""
    if isinstance(device, str) and device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch_devices()[0]
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None and torch.cuda.is_available():
        # "cuda" means the calling thread's current device; batches are made in another thread.
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def collate_format(collate_fn: Callable[..., object]) -> str:
    """The batch format a collate function takes: Ray's ``ArrowBatchCollateFn`` and
    ``PandasBatchCollateFn`` subclasses take pyarrow / pandas batches; anything else numpy."""
    names = {cls.__name__ for cls in type(collate_fn).__mro__}
    if "ArrowBatchCollateFn" in names:
        return "pyarrow"
    if "PandasBatchCollateFn" in names:
        return "pandas"
    return "numpy"


@dataclass(frozen=True)
class TensorBlock:
    """Rows as tensors: ``groups`` of same-dtype columns stacked as ``(columns, rows)``, and
    the other columns (n-dimensional ones) with rows first."""

    names: tuple[str, ...]
    groups: tuple[tuple[tuple[str, ...], torch.Tensor], ...]
    others: tuple[tuple[str, torch.Tensor], ...]
    rows: int
    ready: Any = None
    """On a GPU: the event after which the tensors hold their rows (None: they do now)."""

    def as_dict(self) -> dict[str, torch.Tensor]:
        if len(self.groups) == 1 and not self.others and self.groups[0][0] == self.names:
            # the common case (every column a number of one dtype): one call, no reordering
            return dict(zip(self.names, self.groups[0][1].unbind(0)))
        out: dict[str, torch.Tensor] = dict(self.others)
        for names, stacked in self.groups:
            out.update(zip(names, stacked.unbind(0)))
        return {name: out[name] for name in self.names}

    def map(
        self, group: Callable[[torch.Tensor], torch.Tensor], other: Callable[..., Any], rows: int
    ) -> TensorBlock:
        return TensorBlock(
            self.names,
            tuple((n, group(t)) for n, t in self.groups),
            tuple((n, other(t)) for n, t in self.others),
            rows,
            self.ready,
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for _, t in self.groups] + [t for _, t in self.others]


class TensorOps(BlockOps[TensorBlock]):
    """Block operations on :class:`TensorBlock`; ``dtypes`` as ``iter_torch_batches`` takes it.
    ``private``: the rows read are this batch's own memory (decoded from files). ``device``:
    where batches go; with a CUDA device blocks are staged there as they are read, and
    :meth:`finish` hands a batch to the calling thread's stream."""

    def __init__(
        self,
        dtypes: object,
        private: bool,
        device: torch.device | None = None,
        stack_columns: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.dtypes = dtypes
        self.private = private
        self.device = device
        self.stack_columns = stack_columns or {}
        self._grouped = {c for cols in self.stack_columns.values() for c in cols}
        self.feed: CudaFeed | None = None
        if device is not None and device.type == "cuda" and torch.cuda.is_available():
            self.feed = CudaFeed(device)

    def from_arrow(self, batch: pa.RecordBatch) -> TensorBlock:
        return self._block(arrow_to_numpy(batch), batch.num_rows, None)

    def from_mixed(self, rows: MixedRows) -> TensorBlock:
        """A mixed dataset's block of steps (``_mix_blocks``): each column's rows written
        straight into its group's block (one copy, as for a block read from one source)."""
        if self.feed is not None or not rows.uniform:
            # a GPU stages host columns; pieces of differing dtypes take their common one
            return self._block({n: rows.column(n) for n in rows.names}, rows.rows, None)
        return self._block(rows.sample, rows.rows, rows)

    def _block(
        self, arrays: dict[str, np.ndarray], rows: int, mixed: MixedRows | None
    ) -> TensorBlock:
        """The block of ``arrays`` (``mixed``: only their dtypes and shapes; the rows come
        from ``mixed``)."""
        filled: set[str] = set()
        if self.stack_columns:
            arrays = self._stacked(arrays, rows, mixed)
            filled = set(self.stack_columns)
        stacks: dict[tuple[str, Any], list[str]] = {}
        others: list[tuple[str, np.ndarray]] = []
        for name, array in arrays.items():
            dtype = self._dtype(name)
            if array.ndim == 1 and array.dtype.kind in "biuf":
                stacks.setdefault((array.dtype.str, dtype), []).append(name)
            else:
                others.append((name, array))
        if self.feed is not None:
            return self._staged(arrays, stacks, others, rows)
        groups = [self._group(arrays, names, dtype, mixed) for (_, dtype), names in stacks.items()]
        tensors = []
        for name, array in others:
            if mixed is not None and name not in filled:
                array = mixed.column(name)
            elif not (self.private or array.flags.writeable):
                array = array.copy()
            tensors.append((name, _tensor(name, array, self._dtype(name))))
        return TensorBlock(tuple(arrays), tuple(groups), tuple(tensors), rows)

    @staticmethod
    def _group(
        arrays: dict[str, np.ndarray], names: list[str], dtype: Any, mixed: MixedRows | None
    ) -> tuple[tuple[str, ...], torch.Tensor]:
        """Same-dtype 1-D columns as one ``(columns, rows)`` tensor: one copy."""
        if mixed is None:
            block = _stack([arrays[n] for n in names])
        else:
            block = np.empty((len(names), mixed.rows), dtype=arrays[names[0]].dtype)
            mixed.fill_group(names, block)
        stacked = torch.from_numpy(block)
        return tuple(names), stacked if dtype is None else stacked.to(dtype)

    def _stacked(
        self, arrays: dict[str, np.ndarray], rows: int, mixed: MixedRows | None
    ) -> dict[str, np.ndarray]:
        """The columns of each ``stack_columns`` group as one row-major ``(rows, columns)``
        array (one copy per block), so a batch of it is a slice: one tensor, no per-column
        work when it is handed out, one transfer to a GPU."""
        out = {k: v for k, v in arrays.items() if k not in self._grouped}
        for name, columns in self.stack_columns.items():
            parts = [arrays[c] for c in columns]
            kind = np.result_type(*parts)
            # one strided write per column straight into the row-major block: about 2-3x
            # faster than stacking the columns (a memcpy each) and then transposing that copy
            block = np.empty((rows, len(parts)), dtype=kind)
            for j, (column, part) in enumerate(zip(columns, parts)):
                if mixed is None:
                    block[:, j] = part
                else:
                    mixed.fill(column, block[:, j])
            out[name] = block
        return out

    def _dtype(self, name: str) -> Any:
        return self.dtypes.get(name) if isinstance(self.dtypes, dict) else self.dtypes

    def _staged(
        self,
        arrays: dict[str, np.ndarray],
        stacks: dict[tuple[str, Any], list[str]],
        others: list[tuple[str, np.ndarray]],
        rows: int,
    ) -> TensorBlock:
        """The block on the GPU: numeric columns through pinned staging, in one copy; a column
        of anything else is made a tensor as on the CPU (or named in the error) and copied on
        its own."""
        feed = self.feed
        assert feed is not None
        names = [tuple(n) for n in stacks.values()]
        parts = [Part(tuple(arrays[n] for n in ns), True, d) for (_, d), ns in stacks.items()]
        direct = []
        for name, array in others:
            if array.dtype.kind in "biuf":
                names.append((name,))
                parts.append(Part((np.ascontiguousarray(array),), False, self._dtype(name)))
            else:
                direct.append((name, _tensor(name, array, self._dtype(name))))
        tensors, ready = feed.upload(parts) if parts else ([], None)
        if direct:
            # rare: a plain copy from pageable memory, done when it returns
            waits = [ready] if ready is not None else []
            direct, ready = feed.run(waits, lambda: [(n, t.to(feed.device)) for n, t in direct])
        groups = tuple((ns, t) for ns, t, p in zip(names, tensors, parts) if p.stack)
        staged = [(ns[0], t) for ns, t, p in zip(names, tensors, parts) if not p.stack]
        return TensorBlock(tuple(arrays), groups, (*staged, *direct), rows, ready)

    def finish(self, block: TensorBlock) -> dict[str, torch.Tensor]:
        """The batch as a dict of tensors on ``device``, ready for the calling thread's stream
        (what ``iter_torch_batches`` gives the user)."""
        if self.feed is None:
            batch: dict[str, torch.Tensor] = block.as_dict()
            return batch if self.device is None else to_device(batch, self.device)
        if block.ready is not None:
            self.feed.hand_over(block.ready, block.tensors())
        return block.as_dict()

    def cutter(self, block: TensorBlock) -> Callable[[int, int], dict[str, torch.Tensor]] | None:
        """What ``finish(slice(block, lo, hi))`` gives, without a block per batch, for a CPU
        block of one group in table order (the common case: a batch of a few rows costs
        torch's ``unbind`` and little more); None for any other block."""
        on_cpu = self.feed is None and (self.device is None or self.device.type == "cpu")
        if not on_cpu or block.others or len(block.groups) != 1:
            return None
        names, stacked = block.groups[0]
        if names != block.names:
            return None
        return lambda lo, hi: dict(zip(names, stacked[:, lo:hi].unbind(0)))

    def length(self, block: TensorBlock) -> int:
        return block.rows

    def slice(self, block: TensorBlock, start: int, stop: int) -> TensorBlock:
        return block.map(lambda t: t[:, start:stop], lambda t: t[start:stop], stop - start)

    def concat(self, blocks: list[TensorBlock]) -> TensorBlock:
        if len(blocks) == 1:
            return blocks[0]
        return self._on_device(blocks, lambda: _concat(blocks))

    def take(self, block: TensorBlock, indices: np.ndarray) -> TensorBlock:
        def take() -> TensorBlock:
            index = torch.from_numpy(indices)
            if block.ready is not None:
                index = index.to(block.tensors()[0].device)
            return block.map(lambda t: t[:, index], lambda t: t[index], len(indices))

        return self._on_device([block], take)

    def _on_device(self, blocks: list[TensorBlock], work: Callable[[], TensorBlock]) -> TensorBlock:
        """``work`` as is on the CPU; on the GPU, on the side stream after the blocks' copies."""
        waits = [b.ready for b in blocks if b.ready is not None]
        if self.feed is None or not waits:
            return work()
        block, ready = self.feed.run(waits, work)
        return replace(block, ready=ready)


def _stack(columns: list[np.ndarray]) -> np.ndarray:
    """``np.stack`` of 1-D same-dtype columns, about twice as fast (no per-column reshape)."""
    out = np.empty((len(columns), len(columns[0])), dtype=columns[0].dtype)
    np.concatenate(columns, out=out.reshape(-1))
    return out


def _concat(blocks: list[TensorBlock]) -> TensorBlock:
    first = blocks[0]
    groups = tuple(
        (names, _cat([b.groups[i][1] for b in blocks], 1))
        for i, (names, _) in enumerate(first.groups)
    )
    others = tuple(
        (name, _cat([b.others[i][1] for b in blocks], 0))
        for i, (name, _) in enumerate(first.others)
    )
    return TensorBlock(first.names, groups, others, sum(b.rows for b in blocks))


def _cat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``; on the CPU numpy's single-threaded copy (torch's intra-op threads cost
    10x on a busy machine, and its cat of strided slices is slow)."""
    if tensors[0].device.type == "cpu":
        arrays = as_numpy(tensors)
        if arrays is not None:
            return torch.from_numpy(np.concatenate(arrays, axis=dim))
    return torch.cat(tensors, dim)


_readonly_warning_spent = False


def _tensor(name: str, array: np.ndarray, dtype: torch.dtype | None) -> torch.Tensor:
    global _readonly_warning_spent
    try:
        if array.dtype.kind not in "biuf":
            return torch.as_tensor(array, dtype=dtype)
    except (TypeError, ValueError) as exc:
        example = describe_value(array[0]) if len(array) else "no rows"
        raise TypeError(
            f"Column {name!r} ({array.dtype}; first value {example}) cannot become a tensor: "
            f"{shorten(str(exc))}.\nHINT: read only numeric columns (read_parquet(..., "
            "columns=[...])); give list columns the same length in every row; or pass "
            "collate_fn= to build the batch yourself."
        ) from exc
    if array.flags.writeable or _readonly_warning_spent:
        tensor = torch.from_numpy(array)
    else:
        # Rows decoded from files: memory only this batch uses, flagged read-only by Arrow, so
        # writing to it is safe. torch warns once per process about such arrays; not useful.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(array)
        _readonly_warning_spent = True
    return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)


def to_device(value: object, device: torch.device) -> Any:
    """Move tensors (alone, or in a dict, list or tuple) to ``device``; leave anything else."""
    if device.type == "cpu":
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def check_stack_columns(stack_columns: object, schema: pa.Schema) -> dict[str, tuple[str, ...]]:
    """``iter_torch_batches(stack_columns=...)`` checked against the columns: a dict of new
    name -> the numeric columns (at least one, each in one group only) it stacks."""
    if not isinstance(stack_columns, dict) or not stack_columns:
        raise ValueError(
            f"stack_columns={stack_columns!r} is invalid: use a dict of name -> list of "
            "columns.\nHINT: stack_columns={'features': ['c0', 'c1', 'c2']}."
        )
    names = list(schema.names)
    seen: dict[str, str] = {}
    out = {}
    for key, columns in stack_columns.items():
        columns = (columns,) if isinstance(columns, str) else tuple(columns)
        if not isinstance(key, str) or not columns:
            raise ValueError(
                f"stack_columns: {key!r} -> {columns!r} is invalid: each name (a str) stacks "
                "a non-empty list of columns.\nHINT: stack_columns={'features': ['c0', 'c1']}."
            )
        for column in columns:
            if column not in names:
                raise ValueError(
                    f"stack_columns[{key!r}] names column {column!r}, which the data does not "
                    f"have; its columns are {shorten(str(names))}.\nHINT: check the spelling."
                )
            if column in seen:
                raise ValueError(
                    f"stack_columns: column {column!r} is in both {seen[column]!r} and "
                    f"{key!r}.\nHINT: put each column in one group."
                )
            kind = schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise ValueError(
                    f"stack_columns[{key!r}]: column {column!r} is {kind}, not a number.\n"
                    "HINT: stack only integer and floating-point columns."
                )
            seen[column] = key
        if key in names and key not in columns:
            raise ValueError(
                f"stack_columns: the name {key!r} is a column of the data already.\nHINT: "
                "give the stacked tensor a new name."
            )
        out[key] = columns
    return out
