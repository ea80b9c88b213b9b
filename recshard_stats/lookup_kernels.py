"""The trainer's embedding kernels, timed: what ``recshard calibrate`` measures and what
``benchmarks/gpu_step_bench.py`` runs a plan's GPU share with. FBGEMM's TBE where it is
installed (:class:`TbeTable`, what TorchRec runs), else plain PyTorch (numpy + torch only, so it
runs on a GPU machine without FBGEMM, TorchRec or Spark):

- a **kernel group** is one tier's tables of one GPU in one weight tensor (as FBGEMM's TBE
  groups them): one pooled ``embedding_bag`` forward for all of its bags;
- the **step** adds a backward shaped like a fused backward + SGD: each lookup's gradient, summed
  per distinct row into an HBM scratch, then each distinct row read, updated and written once;
- **tiers**: ``hbm`` weights are a CUDA tensor; ``host`` weights live in pinned host memory that
  the kernel reads and writes in place (unified virtual addressing: the pinned buffer wrapped as
  a CUDA tensor through ``__cuda_array_interface__``; no managed memory). On ``--device cpu``
  both tiers are CPU tensors, so the loop runs (and is tested) without a GPU.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:  # torch is imported where a kernel runs: the module loads without it
    import torch

HBM, HOST = "hbm", "host"
LEARNING_RATE = 0.01


@dataclasses.dataclass(frozen=True)
class Timing:
    forward_s: float
    step_s: float


class WeightPools:
    """One HBM and one pinned host buffer, allocated once and carved for every configuration
    (pinning GiBs takes seconds; their contents do not change the time of a lookup)."""

    def __init__(self, device: str, hbm_bytes: int, host_bytes: int):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.hbm = torch.zeros(max(hbm_bytes // 4, 1), dtype=torch.float32, device=self.device)
        self._host_pinned = torch.zeros(max(host_bytes // 4, 1), dtype=torch.float32, pin_memory=self.cuda)
        self.host = _mapped(self._host_pinned) if self.cuda else self._host_pinned

    def weights(self, tier: str, rows: int, dim: int):
        pool = self.hbm if tier == HBM else self.host
        if rows * dim > pool.numel():
            raise ValueError(
                f"{tier} pool holds {pool.numel() * 4} bytes, {rows} x {dim} rows need {rows * dim * 4}"
            )
        return pool[: rows * dim].view(rows, dim)


def _mapped(pinned):
    """A CUDA tensor over pinned host memory, read and written in place by kernels (UVA)."""
    import torch

    class _Interface:
        __cuda_array_interface__: ClassVar[dict] = {
            "shape": tuple(pinned.shape),
            "typestr": "<f4",
            "data": (pinned.data_ptr(), False),
            "version": 3,
            "strides": None,
        }

    mapped = torch.as_tensor(_Interface(), device="cuda")
    mapped._keep_alive = pinned  # type: ignore[attr-defined]  # the mapping lives as long as the pinned buffer
    return mapped


@dataclasses.dataclass
class KernelGroup:
    """One embedding_bag call: ``ids`` (rows of ``weights``), bag ``offsets``, and the step's
    distinct rows with each id's position among them."""

    weights: torch.Tensor
    ids: torch.Tensor
    offsets: torch.Tensor
    distinct: torch.Tensor
    inverse: torch.Tensor
    bag: torch.Tensor  # per id: its bag

    @classmethod
    def of(cls, weights, ids: np.ndarray, offsets: np.ndarray) -> KernelGroup:
        import torch

        device = weights.device if weights.device.type == "cuda" else torch.device("cpu")
        as_tensor = lambda a: torch.as_tensor(np.ascontiguousarray(a, dtype=np.int64), device=device)  # noqa: E731
        ids_t = as_tensor(ids)
        distinct, inverse = torch.unique(ids_t, return_inverse=True)
        bag = np.repeat(np.arange(len(offsets)), np.diff(np.append(offsets, len(ids))))
        return cls(weights, ids_t, as_tensor(offsets), distinct, inverse, as_tensor(bag))


def _forward(groups: list[KernelGroup]):
    import torch.nn.functional as F

    return [F.embedding_bag(g.ids, g.weights, g.offsets, mode="sum") for g in groups]


def _step(groups: list[KernelGroup], scratch: list) -> None:
    outputs = _forward(groups)
    for g, out, acc in zip(groups, outputs, scratch, strict=True):
        # d(loss)/d(output) = output (loss = |output|^2 / 2): every lookup gets its bag's gradient
        acc.zero_()
        acc.index_add_(0, g.inverse, out.index_select(0, g.bag))
        rows = g.weights.index_select(0, g.distinct)
        g.weights.index_copy_(0, g.distinct, rows - LEARNING_RATE * acc)


def time_groups(groups: list[KernelGroup], reps: int = 10) -> Timing:
    """Median seconds of the forward alone and of the whole step over ``reps`` runs (CUDA:
    each captured in a CUDA graph after an eager warm-up, timed with events)."""
    import torch

    groups = [g for g in groups if len(g.offsets)]
    if not groups:
        return Timing(0.0, 0.0)
    scratch = [torch.zeros(len(g.distinct), g.weights.shape[1], device=g.ids.device) for g in groups]
    cuda = groups[0].ids.device.type == "cuda"
    runs = {"forward": lambda: _forward(groups), "step": lambda: _step(groups, scratch)}
    out = {}
    for name, run in runs.items():
        if not cuda:
            run()  # warm-up
            out[name] = median_seconds(run, False, reps)
            continue
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()  # eager warm-up (allocations, lazy init) off the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        torch.cuda.synchronize()
        out[name] = median_seconds(graph.replay, True, reps)
        del graph
    return Timing(out["forward"], out["step"])


def median_seconds(run, cuda: bool, reps: int) -> float:
    """Median seconds of ``reps`` calls of ``run`` (CUDA events on a GPU, the wall clock on CPU)."""
    import torch

    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


TORCH, TBE = "torch", "tbe"


def tbe_available(device: str) -> bool:
    """FBGEMM's TBE importable with kernels for ``device`` (its CUDA build for a GPU)."""
    try:
        import fbgemm_gpu
        import torch
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            SplitTableBatchedEmbeddingBagsCodegen,  # noqa: F401
        )
    except Exception:  # fbgemm_gpu absent, or built for another torch
        return False
    if device.startswith("cuda"):
        return torch.cuda.is_available() and getattr(fbgemm_gpu, "__variant__", "") == "cuda"
    return True


class TbeTable:
    """One table in FBGEMM's TBE (``SplitTableBatchedEmbeddingBagsCodegen``), what TorchRec's
    ``fused`` / ``fused_uvm`` kernels run: HBM rows ``EmbeddingLocation.DEVICE``, host rows
    ``MANAGED`` (unified memory) on a GPU, ``HOST`` on CPU; the step is its forward and the
    backward with the fused exact-SGD update."""

    def __init__(self, tier: str, rows: int, dim: int, ids: np.ndarray, offsets: np.ndarray, device: str):
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        cuda = device.startswith("cuda")
        location = (
            (EmbeddingLocation.DEVICE if tier == HBM else EmbeddingLocation.MANAGED)
            if cuda
            else EmbeddingLocation.HOST
        )
        self.module = SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, dim, location, ComputeDevice.CUDA if cuda else ComputeDevice.CPU)],
            optimizer=EmbOptimType.EXACT_SGD,
            learning_rate=LEARNING_RATE,
            weights_precision=SparseType.FP32,
            pooling_mode=PoolingMode.SUM,
            device=torch.device(device),
        )
        self.ids = torch.as_tensor(np.ascontiguousarray(ids, dtype=np.int64), device=device)
        self.offsets = torch.as_tensor(np.append(offsets, len(ids)).astype(np.int64), device=device)
        self.distinct = len(np.unique(ids))
        self.cuda = cuda

    def forward(self):
        return self.module(self.ids, self.offsets)

    def step(self) -> None:
        out = self.forward()
        out.backward(out)  # d(|out|^2 / 2) = out, as the plain kernel's step


def time_tbe(table: TbeTable, reps: int = 10) -> Timing:
    """Median seconds of the TBE forward and step, run eagerly (CUDA events on a GPU)."""
    out = {}
    for name, run in (("forward", table.forward), ("step", table.step)):
        run()  # warm-up
        out[name] = median_seconds(run, table.cuda, reps)
    return Timing(out["forward"], out["step"])


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def release_cached_memory() -> None:
    import torch

    torch.cuda.empty_cache()


def device_name(device: str) -> str:
    import torch

    if device == "cpu":
        return "cpu (loop check only: not a GPU's costs)"
    return torch.cuda.get_device_name(torch.device(device))


def kernel_name(kernel: str) -> str:
    import torch

    if kernel == TBE:
        import fbgemm_gpu

        return (
            f"FBGEMM {getattr(fbgemm_gpu, '__version__', '?')} TBE, exact SGD (torch {torch.__version__}; "
            "host rows in managed memory)"
        )
    return f"torch {torch.__version__} embedding_bag (plain PyTorch; host rows read in place over UVA)"
