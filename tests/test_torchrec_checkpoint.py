"""Sharded checkpoints (recshard_stats.torchrec_checkpoint) with real TorchRec DMP on CPU/gloo:
saved under one plan on 2 ranks, loaded under another plan (other remaps, other ranks, a
table cut column-wise) on 4 ranks and into a plain unsplit TorchRec collection. Weights are a
closed form of (table, hashed row, column), so every check is against numpy."""

import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")
pytest.importorskip("torchrec", reason="torchrec is not installed (scripts/setup.sh installs it)")

from recshard_stats.errors import RecShardError
from recshard_stats.manifest_loader import load_manifest
from tests.test_torchrec import write_manifest_dir

BIG_ROWS, BIG_DIM = 400_000, 64  # 102 MB in fp32: the rank-memory measurement needs a large table
# name, features, gpu (a rank or column shards' ranks), hash_size, dim, rows_hbm, unique_rows
PLAN_A = [
    ("a", ("fa",), 0, 50, 8, 20, 30),
    ("b", ("fb",), 1, 40, 8, 40, 25),
    ("c", ("fc",), 1, 30, 4, 0, 12),
    ("d", ("d1", "d2"), (1, 0), 60, 8, 45, 35),
    ("big", ("fbig",), 0, BIG_ROWS, BIG_DIM, 1000, 2000),
]
PLAN_B = [  # another day: other remaps (seed), tiers and ranks; big cut over all four ranks
    ("a", ("fa",), 3, 50, 8, 10, 28),
    ("b", ("fb",), 2, 40, 8, 0, 22),
    ("c", ("fc",), 0, 30, 4, 30, 12),
    ("d", ("d1", "d2"), 1, 60, 8, 20, 40),
    ("big", ("fbig",), (2, 0, 3, 1), BIG_ROWS, BIG_DIM, 250_000, 3000),
]


def weight(table_index: int, rows: np.ndarray, dim: int) -> np.ndarray:
    """The reference weights: a closed form of (table, hashed row, column)."""
    columns = np.arange(dim)
    return (
        np.modf(rows[:, None] * 0.6180339 + columns[None, :] * 0.1234 + table_index * 0.37)[0] - 0.5
    ).astype(np.float32)


def _batch(manifest, seed: int):
    from torchrec import KeyedJaggedTensor

    rng = np.random.default_rng(seed)
    keys, values, lengths = [], [], []
    for t in manifest.tables:
        for f in t.features:
            n = rng.integers(0, 5, 8)
            keys.append(f)
            lengths.append(torch.as_tensor(n))
            values.append(torch.as_tensor(rng.integers(0, t.hash_size, int(n.sum()))))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
    )


def _expected(manifest, kjt) -> dict[str, np.ndarray]:
    """Sum pooling of the reference weights, in numpy, from the batch's hashed rows."""
    out = {}
    by_feature = kjt.to_dict()
    for i, t in enumerate(manifest.tables):
        for f in t.features:
            ids, lengths = by_feature[f].values().numpy(), by_feature[f].lengths().numpy()
            bags = np.repeat(np.arange(len(lengths)), lengths)
            pooled = np.zeros((len(lengths), t.dim))
            np.add.at(pooled, bags, weight(i, ids, t.dim))
            out[f] = pooled
    return out


def _max_error(manifest, model, seed: int) -> float:
    kjt = _batch(manifest, seed)
    got = model(kjt).to_dict()
    return max(np.abs(got[f].detach().numpy() - v).max() for f, v in _expected(manifest, kjt).items())


def _worker(
    rank: int, world: int, port: int, manifest_dir: str, checkpoint: str, phase: str, results
) -> None:
    import os
    import resource

    import torch.distributed as dist

    from recshard_stats.torchrec_checkpoint import load_sharded, save_sharded
    from recshard_stats.torchrec_trainer import StaticSplitEmbeddingBagCollection, distributed_model_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        loaded = load_manifest(manifest_dir)
        model = StaticSplitEmbeddingBagCollection(loaded, device=torch.device("meta"))
        dmp = distributed_model_parallel(model, loaded, "", device=torch.device("cpu"))
        shard_bytes = sum(
            s.tensor.numel() * s.tensor.element_size()
            for v in dmp.state_dict().values()
            if hasattr(v, "local_shards")
            for s in v.local_shards()
        )
        if phase == "save":
            # fill this rank's shards from the reference: a part's row is a remap position
            state = dmp.state_dict()
            for i, t in enumerate(loaded.manifest.tables):
                new_index = loaded.new_index(t.name, np.arange(t.hash_size))
                order = np.argsort(new_index) if 0 < t.rows_hbm < t.hash_size else np.arange(t.hash_size)
                for name, first in (
                    [(f"{t.name}__hbm", 0), (f"{t.name}__uvm", t.rows_hbm)]
                    if 0 < t.rows_hbm < t.hash_size
                    else [(t.name, 0)]
                ):
                    for s in state[f"collection.embedding_bags.{name}.weight"].local_shards():
                        (row, col), (rows, cols) = s.metadata.shard_offsets, s.metadata.shard_sizes
                        hashed = order[first + row : first + row + rows]
                        s.tensor.copy_(torch.as_tensor(weight(i, hashed, t.dim)[:, col : col + cols]))
            error = _max_error(loaded.manifest, dmp, 100 + rank)
            save_sharded(dmp, loaded, "", checkpoint)
            results.put((rank, error, 0, shard_bytes))
        else:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            load_sharded(dmp, loaded, "", checkpoint)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            error = _max_error(loaded.manifest, dmp, 200 + rank)
            results.put((rank, error, peak * 1024, shard_bytes))
    finally:
        dist.destroy_process_group()


def _run(world: int, manifest_dir, checkpoint, phase: str) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _worker,
        args=(world, port, str(manifest_dir), str(checkpoint), phase, results),
        nprocs=world,
        start_method="spawn",
    )
    return {
        rank: (error, peak, shard_bytes)
        for rank, error, peak, shard_bytes in (results.get() for _ in range(world))
    }


@pytest.mark.slow  # six processes with torchrec, a 100 MB table
def test_a_checkpoint_saved_under_one_plan_loads_under_another_and_unsplit(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torchrec import EmbeddingBagCollection

    from recshard_stats.torchrec_trainer import table_configs

    plan_a = write_manifest_dir(tmp_path / "a" / "ds=2026-12-01", PLAN_A, num_gpus=2, seed=0)
    plan_b = write_manifest_dir(tmp_path / "b" / "ds=2026-12-02", PLAN_B, num_gpus=4, seed=1)
    checkpoint = tmp_path / "checkpoint"

    saved = _run(2, plan_a.path.parent, checkpoint, "save")
    assert all(error < 1e-5 for error, _, _ in saved.values())  # the filled model is the reference
    assert checkpoint.is_dir() and not (tmp_path / "_tmp-checkpoint").exists()

    loaded = _run(4, plan_b.path.parent, checkpoint, "load")
    table_bytes = sum(t.hash_size * t.dim * 4 for t in plan_b.manifest.tables)
    block_bytes = BIG_ROWS // 4 * BIG_DIM * 4
    for rank, (error, peak, shard_bytes) in loaded.items():
        assert error < 1e-5, rank  # plan B's model computes what the reference weights give
        # what a rank adds while loading: its block, one piece read by DCP, its rows in flight;
        # never the whole tables (split_state_dict's way needs all of them, twice)
        assert peak < 2 * block_bytes + 2 * shard_bytes + 32 * 2**20, (rank, peak, shard_bytes)
        assert peak < 0.9 * table_bytes, (rank, peak, table_bytes)
    print({rank: (peak, shard_bytes) for rank, (_, peak, shard_bytes) in loaded.items()}, table_bytes)

    # a plain TorchRec collection of the unsplit tables, in one process, with DCP alone
    plain = EmbeddingBagCollection(tables=table_configs(plan_b.manifest, split=False))
    dcp.load(
        {
            f"embedding_bags.{t.name}.weight": plain.embedding_bags[t.name].weight
            for t in plan_b.manifest.tables
        },
        checkpoint_id=str(checkpoint),
    )
    for i, t in enumerate(plan_b.manifest.tables):
        np.testing.assert_array_equal(
            plain.embedding_bags[t.name].weight.detach().numpy(), weight(i, np.arange(t.hash_size), t.dim)
        )


def test_a_checkpoint_of_another_model_is_refused_naming_the_table(tmp_path):
    import json

    from recshard_stats.torchrec_checkpoint import CHECKPOINT_INFO, check_checkpoint

    loaded = write_manifest_dir(tmp_path / "ds=2026-12-01", PLAN_A[:4], num_gpus=2)
    with pytest.raises(RecShardError, match="is not a recshard checkpoint"):
        check_checkpoint(loaded, tmp_path)
    info = {t.name: {"hash_size": t.hash_size, "dim": t.dim, "hash": t.hash} for t in loaded.manifest.tables}
    info["c"]["dim"] = 8
    (tmp_path / CHECKPOINT_INFO).write_text(json.dumps({"tables": info}))
    with pytest.raises(RecShardError, match=r"table 'c': checkpoint .* holds .*'dim': 8"):
        check_checkpoint(loaded, tmp_path)
    del info["c"]
    (tmp_path / CHECKPOINT_INFO).write_text(json.dumps({"tables": info}))
    with pytest.raises(RecShardError, match="has no table 'c'"):
        check_checkpoint(loaded, tmp_path)


@pytest.mark.slow  # torchrun, twice
def test_the_readmes_training_snippet_runs_as_written(tmp_path):
    """The README's train.py under torchrun on CPU (gloo), against a manifest in the layout it
    names: the first run saves a checkpoint, the second loads it."""
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(# train.py.*?)```", readme, re.S).group(1)
    (tmp_path / "train.py").write_text(snippet)
    loaded = write_manifest_dir(tmp_path / "manifests" / "ds=2026-12-01", PLAN_A[:4], num_gpus=2)
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    for _ in range(2):
        done = subprocess.run(
            [str(torchrun), "--nproc-per-node", str(loaded.num_gpus), "train.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert (tmp_path / "checkpoint" / ".metadata").is_file()
