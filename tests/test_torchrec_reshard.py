"""A new plan applied to a live TorchRec model (recshard_stats.torchrec_trainer.reshard_in_place):
real DistributedModelParallel on CPU/gloo, two ranks, every table and column shard moved to the
other rank by the new manifest. Checked against the same training without the move (the
placement does not change what the model computes) and against the new manifest's ranks."""

import dataclasses
import os
import shutil
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from recshard_stats.manifest_loader import load_manifest
from recshard_stats.manifest_publisher import write_manifest
from recshard_stats.torchrec_trainer import split_parts
from tests.test_torchrec import TABLES, _batch, _manifest_with, write_manifest_dir

LR = 0.3


def _worker(rank: int, world: int, port: int, old_dir: str, new_dir: str, results) -> None:
    """One rank: a model (a split collection and a dense layer) sharded by the old plan with
    row-wise Adagrad fused, its weights set from a fixed draw; one training step; then, when
    ``new_dir`` is given, the new plan applied in place; then a second step. Puts the second
    step's forward output, this rank's weight and optimizer-state shards after it, and the
    parts it holds."""
    import os

    import torch.distributed as dist
    from torch import nn

    from recshard_stats.errors import RecShardError
    from recshard_stats.torchrec_trainer import (
        StaticSplitEmbeddingBagCollection,
        apply_optimizer,
        distributed_model_parallel,
        reshard_in_place,
        split_state_dict,
    )

    class Trainer(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.sparse = sparse
            self.dense = nn.Linear(1, 1)

        def forward(self, kjt):
            return self.dense(self.sparse(kjt).values().sum(dim=1, keepdim=True))

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        old = load_manifest(old_dir)
        torch.manual_seed(0)
        model = Trainer(StaticSplitEmbeddingBagCollection(old, device=torch.device("meta")))
        apply_optimizer(model, old, "sparse", lr=LR, eps=1e-8)
        dmp = distributed_model_parallel(model, old, "sparse", device=torch.device("cpu"))
        generator = torch.Generator().manual_seed(0)
        weights = {t.name: torch.randn(t.hash_size, t.dim, generator=generator) for t in old.manifest.tables}
        split = split_state_dict(old, weights)
        for key, value in dmp.state_dict().items():
            if key.startswith("sparse.collection."):
                for shard in value.local_shards():
                    (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(
                        split[key.split("collection.", 1)[1]][row : row + rows, col : col + cols]
                    )
        dmp(_batch(old, np.random.default_rng(10 + rank))).sum().backward()
        moved = None
        if new_dir:
            try:
                moved = reshard_in_place(dmp, old.manifest, load_manifest(new_dir).manifest, "sparse")
            except RecShardError as error:
                results.put((rank, "refused", str(error)))
                _leave()  # both ranks refused after the same gather
        out = dmp(_batch(old, np.random.default_rng(20 + rank)))
        out.sum().backward()
        held = {}
        for key, value in dmp.state_dict().items():
            if key.startswith("sparse.collection."):
                for shard in value.local_shards():
                    held[(key.split(".")[-2], tuple(shard.metadata.shard_offsets))] = (
                        shard.tensor.clone().numpy()
                    )
        state = {}
        for key, states in dmp.fused_optimizer.state_dict()["state"].items():
            for name, tensor in states.items():
                for shard in getattr(tensor, "local_shards", list)():
                    state[(key, name, tuple(shard.metadata.shard_offsets))] = shard.tensor.clone().numpy()
        results.put((rank, out.detach().numpy(), held, state, moved))
        _leave()
    except BaseException:
        dist.destroy_process_group()
        raise


def _leave() -> None:
    """A rank whose results are in: it meets the other, then exits at once. Tearing gloo down, or
    the interpreter's exit after it, aborted a rank now and then ('terminate called without an
    active exception', SIGABRT: 2 of 5 runs of this file without the barrier, and in 2 full runs
    of the suite with it, once on each path), after both had put their results; the results
    queue is written synchronously, so nothing is lost by leaving without it."""
    import torch.distributed as dist

    dist.barrier()
    os._exit(0)


def _spawn(old_dir, new_dir="") -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _worker, args=(2, port, str(old_dir), str(new_dir), results), nprocs=2, start_method="spawn"
    )
    return {r[0]: r[1:] for r in (results.get() for _ in range(2))}


@pytest.fixture(scope="module")
def swapped(tmp_path_factory):
    """Plan A (the torchrec tests' tables plus one cut into column shards on both ranks) and
    plan B, the same with every rank exchanged for the other (the same parts, all moved); both
    train with row-wise Adagrad, whose per-row state has to travel with the rows."""
    root = tmp_path_factory.mktemp("reshard")
    old = _manifest_with(
        write_manifest_dir(root / "ds=2026-12-01", [*TABLES, ("f", ("ff",), (0, 1), 40, 8, 40, 20)]),
        optimizer="rowwise_adagrad",
    )
    m = old.manifest
    tables = tuple(
        dataclasses.replace(
            t,
            gpu=1 - t.gpu,
            column_shards=tuple(dataclasses.replace(c, gpu=1 - c.gpu) for c in t.column_shards),
        )
        for t in m.tables
    )
    gpus = tuple(dataclasses.replace(m.gpus[1 - r], rank=r) for r in range(2))
    shutil.copytree(old.path.parent, root / "ds=2026-12-02")
    write_manifest(root / "ds=2026-12-02" / "manifest.json", dataclasses.replace(m, tables=tables, gpus=gpus))
    return old.path.parent, root / "ds=2026-12-02"


@pytest.mark.slow  # two trainings of two ranks each
def test_a_model_resharded_in_place_trains_on_as_it_would_have(swapped, monkeypatch):
    """After the move each rank holds exactly plan B's parts, TorchRec reports the moved data,
    and the second step's outputs, weights and row-wise Adagrad state equal those of the run
    that stayed on plan A (the optimizer state travelled with the weights)."""
    old_dir, new_dir = swapped
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # TorchRec's gloo tags hash table names
    stayed, moved = _spawn(old_dir), _spawn(old_dir, new_dir)
    new = load_manifest(new_dir).manifest
    for rank in (0, 1):
        out_a, held_a, _, _ = stayed[rank]
        out_b, held_b, state_b, volume = moved[rank]
        np.testing.assert_allclose(out_b, out_a, rtol=1e-5, atol=1e-6)
        assert sorted({part for part, _ in held_b}) == sorted(
            p.name for p in split_parts(new) if rank in p.ranks
        )
        assert volume > 0
        other = 1 - rank  # what this rank holds now, the other held before
        for key, tensor in held_b.items():
            np.testing.assert_allclose(tensor, stayed[other][1][key], rtol=1e-5, atol=1e-6)
        assert len(state_b) == len(stayed[other][2]) > 0
        for key, tensor in state_b.items():
            np.testing.assert_allclose(tensor, stayed[other][2][key], rtol=1e-5, atol=1e-6)
        assert not set(held_a) & set(held_b)  # every part changed rank


@pytest.mark.slow  # two ranks
def test_ranks_with_different_hash_seeds_are_refused_rather_than_left_waiting(swapped, monkeypatch):
    old_dir, new_dir = swapped
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # each process draws its own
    by_rank = _spawn(old_dir, new_dir)
    for rank in (0, 1):
        assert by_rank[rank][0] == "refused"
        assert "PYTHONHASHSEED" in by_rank[rank][1] and "same PYTHONHASHSEED" in by_rank[rank][1]


def test_a_part_that_changes_shape_is_refused_before_anything_moves(swapped, tmp_path):
    """HBM rows moved between the tiers: the parts' shapes differ, which TorchRec's reshard
    cannot do; refused naming the parts (no process group is needed to tell)."""
    from recshard_stats.errors import RecShardError
    from recshard_stats.torchrec_trainer import StaticSplitEmbeddingBagCollection, reshard_in_place

    old_dir, _ = swapped
    old = load_manifest(old_dir).manifest
    grown = [("a", ("fa",), 0, 50, 8, 25, 30), *TABLES[1:], ("f", ("ff",), (0, 1), 40, 8, 40, 20)]
    assert TABLES[0][5] == 20  # a's HBM rows, 25 in the new plan
    new = write_manifest_dir(tmp_path / "ds=2026-12-02", grown).manifest

    class Live(torch.nn.Module):  # what reshard_in_place reads of a DMP before any message
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Module()
            self.module.sparse = StaticSplitEmbeddingBagCollection(
                load_manifest(old_dir), device=torch.device("meta")
            )
            self.device = torch.device("cpu")

    with pytest.raises(RecShardError, match=r"changes the shape of 2 part\(s\) \(a__hbm, a__uvm\)"):
        reshard_in_place(Live(), old, new, "sparse")
