"""The plan in a real TorchRec (CPU build: torch 2.13 + fbgemm-gpu-cpu + torchrec, installed by
scripts/setup.sh): the static split computes exactly what the unsplit tables do, forward,
backward and over SGD steps, and its ShardingPlan is accepted by TorchRec."""

import dataclasses
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/setup.sh installs the torchrec extra)"
)
torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (scripts/setup.sh installs it)")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

from recshard_stats.config import FeatureConfig, TableConfig
from recshard_stats.costmodel import ComputeKernel
from recshard_stats.errors import RecShardError
from recshard_stats.manifest import ColumnShard, GpuPlacement, Manifest, RemapFile
from recshard_stats.manifest_loader import ManifestFile, load_manifest, sha256_data
from recshard_stats.torchrec_trainer import (
    StaticSplitEmbeddingBagCollection,
    sharding_plan,
    split_parts,
    split_state_dict,
    unsplit_state_dict,
)
from tests.conftest import ROOT

# name, features, gpu, hash_size, dim, rows_hbm, unique_rows
TABLES = [
    ("a", ("fa",), 0, 50, 8, 20, 30),  # both tiers, seen rows in both
    ("b", ("fb",), 1, 40, 8, 40, 25),  # wholly in HBM
    ("c", ("fc",), 1, 30, 4, 0, 12),  # wholly in UVM
    ("d", ("d1", "d2"), 0, 60, 8, 45, 35),  # shared; HBM holds every seen row and 10 unseen ones
    ("e", ("fe",), 1, 20, 4, 5, 0),
]  # never seen: the remap is empty


def write_manifest_dir(directory, tables=TABLES, num_gpus: int = 2, seed: int = 0) -> ManifestFile:
    """A manifest of ``tables`` (from a real one, resized) with random remaps on disk, in
    ``directory``. A table's gpu is a rank, or a tuple of ranks: equal column shards on them."""
    base = Manifest.from_json((ROOT / "tests" / "data" / "manifest_v1_2b2c487.json").read_text())
    rng = np.random.default_rng(seed)
    template = base.tables[0]
    directory = pathlib.Path(directory)
    (directory / "remap").mkdir(parents=True)
    placed = []
    for name, features, gpu, hash_size, dim, rows_hbm, unique in tables:
        seen = rng.choice(hash_size, unique, replace=False)
        part = directory / "remap" / f"{name}.parquet"
        part.mkdir()
        remap = {
            "row": pa.array(seen, pa.int64()),
            "index": pa.array(rng.permutation(unique), pa.int64()),
            "access_count": pa.array(np.ones(unique), pa.int64()),
        }
        pq.write_table(pa.table(remap), part / "part-0.parquet")
        ranks = gpu if isinstance(gpu, tuple) else (gpu,)
        width = dim // len(ranks)
        shards = tuple(
            ColumnShard(g, i * width, width, template.predicted_cost_ms / len(ranks), 0)
            for i, g in enumerate(ranks)
        )
        placed.append(
            dataclasses.replace(
                template,
                name=name,
                features=features,
                gpu=ranks[0],
                hash_size=hash_size,
                dim=dim,
                row_bytes=base.hardware.row_bytes(dim),
                rows_hbm=rows_hbm,
                rows_uvm=hash_size - rows_hbm,
                unique_rows=unique,
                unused_rows=hash_size - unique,
                feature_pooling=(1.0,) * len(features),
                remap=RemapFile(f"remap/{name}.parquet", sha256_data(part), unique),
                column_shards=shards if len(ranks) > 1 else (),
            )
        )
    gpus = []
    for g in range(num_gpus):
        parts = [(t, p) for t in placed for p in t.gpu_parts if p.gpu == g]
        gpus.append(
            GpuPlacement(
                g,
                tuple(t.name for t, _ in parts),
                round(sum(t.rows_hbm * t.row_bytes * p.share for t, p in parts)),
                base.hardware.usable_hbm_bytes,
                sum(p.predicted_cost_ms for _, p in parts),
            )
        )
    plan = dataclasses.replace(base.plan, objective_ms=max(g.predicted_cost_ms for g in gpus), baselines=())
    model = dataclasses.replace(
        base.model,
        features=tuple(FeatureConfig(f, "int64") for t in placed for f in t.features),
        tables=tuple(TableConfig(t.name, t.features, t.hash_size, t.dim, t.hash) for t in placed),
    )
    manifest = dataclasses.replace(base, model=model, tables=tuple(placed), gpus=tuple(gpus), plan=plan)
    (directory / "manifest.json").write_text(manifest.to_json())
    return load_manifest(directory)


def _manifest_dir(tmp_path) -> ManifestFile:
    return write_manifest_dir(tmp_path / "ds=2026-12-01")


@pytest.fixture
def loaded(tmp_path):
    return _manifest_dir(tmp_path)


def _unsplit(loaded, pooling) -> EmbeddingBagCollection:
    torch.manual_seed(1)
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.dim,
                num_embeddings=t.hash_size,
                feature_names=list(t.features),
                pooling=pooling,
            )
            for t in loaded.manifest.tables
        ]
    )


def _split(loaded, pooling, unsplit) -> StaticSplitEmbeddingBagCollection:
    split = StaticSplitEmbeddingBagCollection(loaded, pooling=pooling)
    weights = {t.name: unsplit.embedding_bags[t.name].weight.detach() for t in loaded.manifest.tables}
    split.collection.load_state_dict(split_state_dict(loaded, weights))
    return split


def _batch(loaded, rng, batch=16) -> KeyedJaggedTensor:
    """Random bags: empty ones, multi-hot ones, ids anywhere in each table (both tiers, seen or not)."""
    keys, values, lengths = [], [], []
    for t in loaded.manifest.tables:
        for f in t.features:
            n = rng.integers(0, 6, batch)
            n[:2] = 0  # always some empty bags
            keys.append(f)
            lengths.append(torch.as_tensor(n))
            values.append(torch.as_tensor(rng.integers(0, t.hash_size, int(n.sum()))))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
    )


def test_split_layout_and_its_sharding_plan(loaded):
    parts = {p.name: p for p in split_parts(loaded.manifest)}
    assert sorted(parts) == ["a__hbm", "a__uvm", "b", "c", "d__hbm", "d__uvm", "e__hbm", "e__uvm"]
    assert (parts["a__hbm"].rows, parts["a__uvm"].rows, parts["a__uvm"].first_row) == (20, 30, 20)
    assert (parts["b"].kernel, parts["c"].kernel, parts["a__hbm"].kernel, parts["a__uvm"].kernel) == (
        ComputeKernel.FUSED,
        ComputeKernel.FUSED_UVM,
        ComputeKernel.FUSED,
        ComputeKernel.FUSED_UVM,
    )
    plan = sharding_plan(loaded.manifest, "sparse.ebc.collection")
    module_plan = plan.plan["sparse.ebc.collection"]
    for name, p in parts.items():
        sharding = module_plan[name]
        assert sharding.sharding_type == "table_wise" and sharding.ranks == list(p.ranks)
        assert sharding.compute_kernel == p.kernel
        assert sharding.sharding_spec.shards[0].shard_sizes[0] == p.rows
    cpu = sharding_plan(loaded.manifest, device_type="cpu").plan[""]
    assert {s.compute_kernel for s in cpu.values()} == {ComputeKernel.FUSED}


def test_a_table_cut_into_column_shards_is_column_wise_on_their_ranks(loaded):
    """Table a (dim 8, rows in both tiers) cut into two column shards, on GPU 0 (columns 0-3)
    and GPU 1 (4-7): both of its parts are column-wise over ranks [0, 1], each shard with all of
    the part's rows and 4 columns; the export says the same."""
    from recshard_stats.export import torchrec_plan
    from recshard_stats.manifest import ColumnShard

    m = loaded.manifest
    a = m.table("a")
    cut = dataclasses.replace(
        a,
        column_shards=(
            ColumnShard(0, 0, 4, a.predicted_cost_ms / 2, a.trainer_buffer_bytes // 2),
            ColumnShard(
                1, 4, 4, a.predicted_cost_ms / 2, a.trainer_buffer_bytes - a.trainer_buffer_bytes // 2
            ),
        ),
    )
    tables = tuple(cut if t.name == "a" else t for t in m.tables)
    gpus = tuple(
        dataclasses.replace(
            g,
            tables=tuple(t.name for t in tables if g.rank in t.ranks),
            hbm_bytes_used=int(
                sum(
                    t.rows_hbm * t.row_bytes * p.share for t in tables for p in t.gpu_parts if p.gpu == g.rank
                )
            ),
            predicted_cost_ms=sum(
                p.predicted_cost_ms for t in tables for p in t.gpu_parts if p.gpu == g.rank
            ),
        )
        for g in m.gpus
    )
    plan = dataclasses.replace(m.plan, objective_ms=max(g.predicted_cost_ms for g in gpus))
    manifest = Manifest.from_json(dataclasses.replace(m, tables=tables, gpus=gpus, plan=plan).to_json())
    # both shards on one GPU, or columns that do not add up to the dim: refused, naming the table
    same_gpu = (cut.column_shards[0], dataclasses.replace(cut.column_shards[1], gpu=0))
    with pytest.raises(RecShardError, match=r"table 'a': column shards on GPUs \[0, 0\] must be two or more"):
        dataclasses.replace(
            manifest,
            tables=tuple(
                dataclasses.replace(t, column_shards=same_gpu) if t.name == "a" else t
                for t in manifest.tables
            ),
        )
    short = (cut.column_shards[0], dataclasses.replace(cut.column_shards[1], columns=3))
    with pytest.raises(RecShardError, match="table 'a': its column shards hold 7 columns, its dim is 8"):
        dataclasses.replace(
            manifest,
            tables=tuple(
                dataclasses.replace(t, column_shards=short) if t.name == "a" else t for t in manifest.tables
            ),
        )
    assert manifest.table("a").ranks == (0, 1) and [t.name for t in manifest.tables_on(1)][:1] == ["a"]
    module_plan = sharding_plan(manifest, device_type="cpu").plan[""]
    for name, rows in (("a__hbm", 20), ("a__uvm", 30)):
        sharding = module_plan[name]
        assert sharding.sharding_type == "column_wise" and sharding.ranks == [0, 1]
        assert [
            (s.shard_sizes, s.shard_offsets, s.placement.rank()) for s in sharding.sharding_spec.shards
        ] == [([rows, 4], [0, 0], 0), ([rows, 4], [0, 4], 1)]
    exported = torchrec_plan(manifest)["tables"]
    assert (exported["a"]["sharding_type"], exported["a"]["ranks"]) == ("column_wise", [0, 1])
    assert (exported["b"]["sharding_type"], exported["b"]["ranks"]) == ("table_wise", [1])


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_split_equals_unsplit_forward_and_backward(loaded, pooling):
    unsplit = _unsplit(loaded, pooling)
    split = _split(loaded, pooling, unsplit)
    rng = np.random.default_rng(2)
    for _ in range(3):
        kjt = _batch(loaded, rng)
        expected, got = unsplit(kjt), split(kjt)
        assert got.keys() == expected.keys() == ["fa", "fb", "fc", "d1", "d2", "fe"]
        torch.testing.assert_close(got.values(), expected.values(), rtol=1e-6, atol=1e-6)
        weight = torch.as_tensor(rng.normal(size=tuple(expected.values().shape)), dtype=torch.float32)
        unsplit.zero_grad()
        split.zero_grad()
        (expected.values() * weight).sum().backward()
        (got.values() * weight).sum().backward()
        grads = unsplit_state_dict(loaded, {k: v.grad for k, v in split.collection.named_parameters()})
        for t in loaded.manifest.tables:
            torch.testing.assert_close(
                grads[t.name], unsplit.embedding_bags[t.name].weight.grad, rtol=1e-6, atol=1e-6
            )


def test_twenty_sgd_steps_give_the_same_losses_and_weights(loaded):
    unsplit = _unsplit(loaded, PoolingType.MEAN)
    split = _split(loaded, PoolingType.MEAN, unsplit)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (unsplit, split)]
    rng = np.random.default_rng(3)
    target = torch.as_tensor(rng.normal(size=(16, 8 + 8 + 4 + 8 + 8 + 4)), dtype=torch.float32)
    losses: dict[int, list[float]] = {0: [], 1: []}
    batches = [_batch(loaded, rng) for _ in range(2)]
    for step in range(20):
        kjt = batches[step % 2]
        for i, (model, optimizer) in enumerate(zip((unsplit, split), optimizers, strict=True)):
            optimizer.zero_grad()
            loss = ((model(kjt).values() - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses[i].append(loss.item())
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert losses[0][-2] < losses[0][0] and losses[0][-1] < losses[0][1]  # it trained
    back = unsplit_state_dict(loaded, split.collection.state_dict())
    for t in loaded.manifest.tables:
        torch.testing.assert_close(
            back[t.name], unsplit.embedding_bags[t.name].weight.detach(), rtol=1e-5, atol=1e-6
        )


def _dmp_worker(rank: int, world: int, port: int, manifest_dir: str, results) -> None:
    """One rank: shard the split collection with the manifest's plan through TorchRec's
    DistributedModelParallel (gloo, CPU), fill its shards from unsplit weights, compare a forward
    with the unsplit tables on this rank's batch, and run a backward."""
    import os

    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        loaded = load_manifest(manifest_dir)
        model = StaticSplitEmbeddingBagCollection(loaded, device=torch.device("meta"))
        plan = sharding_plan(loaded.manifest, "collection", device_type="cpu")
        dmp = DistributedModelParallel(
            model, env=ShardingEnv.from_process_group(dist.group.WORLD), plan=plan, device=torch.device("cpu")
        )
        generator = torch.Generator().manual_seed(0)
        weights = {
            t.name: torch.randn(t.hash_size, t.dim, generator=generator) for t in loaded.manifest.tables
        }
        split = split_state_dict(loaded, weights)
        owned = []
        for key, value in dmp.state_dict().items():
            name = key.split("collection.", 1)[1]
            for shard in value.local_shards():  # a whole table, or a column shard of one
                (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(split[name][row : row + rows, col : col + cols])
                owned.append(name.split(".")[1])
        unsplit = _unsplit(loaded, PoolingType.SUM)
        unsplit.load_state_dict({f"embedding_bags.{name}.weight": w for name, w in weights.items()})
        kjt = _batch(loaded, np.random.default_rng(10 + rank))
        out = dmp(kjt)
        error = (out.values() - unsplit(kjt).values()).abs().max().item()
        out.values().sum().backward()
        results.put((rank, sorted(owned), error))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run_manifest(spark, tmp_path_factory):
    """The manifest `recshard run` leaves (the tests' small model, two GPUs short of HBM)."""
    from recshard_stats import cli
    from tests.helpers import SPEC, write_yaml

    root = tmp_path_factory.mktemp("torchrec_run")
    spec = write_yaml(root / "spec.yaml", SPEC)
    hw = write_yaml(
        root / "hw.yaml",
        {
            "num_gpus": 2,
            "hbm_per_gpu_bytes": 600_000,
            "hbm_reserved_fraction": 0.0,
            "host_gib": 1,
            "batch_size": 64,
        },
    )
    assert (
        cli.main(
            [
                "run",
                "--out",
                str(root / "run"),
                "--spec",
                str(spec),
                "--hardware",
                str(hw),
                "--samples",
                "20000",
                "--time-limit",
                "10",
            ]
        )
        == 0
    )
    return root / "run" / "manifests" / "ds=2026-12-01"


@pytest.mark.slow  # a whole `recshard run`, then one process per rank
def test_the_run_manifests_plan_drives_distributed_model_parallel_on_cpu(run_manifest):
    import socket

    import torch.multiprocessing as mp

    manifest = load_manifest(run_manifest).manifest
    assert any(0 < t.rows_hbm < t.hash_size for t in manifest.tables)  # the split is exercised
    assert any(t.column_shards for t in manifest.tables)  # and column-wise shards (a hot table cut)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(
        _dmp_worker,
        args=(manifest.num_gpus, port, str(run_manifest), results),
        nprocs=manifest.num_gpus,
        start_method="spawn",
    )
    by_rank = {
        rank: (owned, error) for rank, owned, error in (results.get() for _ in range(manifest.num_gpus))
    }
    expected = {
        g: sorted(p.name for p in split_parts(manifest) if g in p.ranks) for g in range(manifest.num_gpus)
    }
    for rank, (owned, error) in by_rank.items():
        assert owned == expected[rank]  # each table (part) lives on the manifest's rank
        assert error < 1e-5


@pytest.mark.slow  # shares the `recshard run` above
def test_the_run_manifests_plan_fits_torchrecs_storage_estimate(run_manifest):
    from recshard_stats.solver.problem import build_problem
    from recshard_stats.stats_reader import load_stats
    from recshard_stats.torchrec_planner import rate_in_torchrec

    manifest = load_manifest(run_manifest).manifest
    problem = build_problem(
        load_stats(load_manifest(run_manifest).stats_path), manifest.model, manifest.hardware
    )
    gpu, rows = tuple(t.ranks for t in manifest.tables), tuple(t.rows_hbm for t in manifest.tables)
    rating = rate_in_torchrec(problem, gpu, rows)
    assert rating.fits, (rating.hbm_needed, rating.hbm_usable)
    # the manifest's own account: rows and the trainer's buffers within the usable HBM
    assert all(
        g.trainer_buffer_bytes > 0 and g.hbm_bytes_used + g.trainer_buffer_bytes <= g.hbm_bytes_capacity
        for g in manifest.gpus
    )
    # TorchRec's own cache instead of the split needs its cache state in HBM too: a plan for the
    # split does not leave room for it
    assert not rate_in_torchrec(problem, gpu, rows, cache=True).fits


def test_unsplit_plans_use_torchrecs_cache_only_when_asked(loaded):
    with pytest.raises(ValueError, match="table 'a' has rows in both tiers"):
        sharding_plan(loaded.manifest, split=False)
    plan = sharding_plan(loaded.manifest, split=False, cache=True).plan[""]
    assert (plan["a"].compute_kernel, plan["b"].compute_kernel, plan["c"].compute_kernel) == (
        "fused_uvm_caching",
        ComputeKernel.FUSED,
        ComputeKernel.FUSED_UVM,
    )
    assert plan["a"].cache_params.load_factor == pytest.approx(20 / 50)
    assert plan["c"].cache_params is None and plan["a"].ranks == [0] and plan["c"].ranks == [1]


def test_torchrecs_planner_takes_the_measured_statistics(loaded):
    """For teams that keep TorchRec's planner: it plans with our pooling factors and cache
    statistics (a made-up CUDA topology on CPU, no process group)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from recshard_stats.torchrec_trainer import parameter_constraints, table_configs

    constraints = parameter_constraints(loaded.manifest)
    assert constraints["d"].pooling_factors == [1.0, 1.0] and constraints["d"].feature_names == ["d1", "d2"]
    # TorchRec's cache sized as the plan's HBM part (split tables only): one meaning everywhere
    assert constraints["a"].cache_params.load_factor == pytest.approx(20 / 50)
    assert sharding_plan(loaded.manifest, split=False, cache=True).plan[""]["a"].cache_params.load_factor == (
        constraints["a"].cache_params.load_factor
    )
    assert constraints["b"].cache_params is None and constraints["c"].cache_params is None
    collection = EmbeddingBagCollection(
        tables=table_configs(loaded.manifest, split=False), device=torch.device("meta")
    )
    topology = Topology(
        world_size=2, compute_device="cuda", hbm_cap=200_000, ddr_cap=10**9, local_world_size=2
    )
    plan = EmbeddingShardingPlanner(topology=topology, batch_size=64, constraints=constraints).plan(
        collection, [EmbeddingBagCollectionSharder()]
    )
    planned = plan.plan[""]
    assert sorted(planned) == ["a", "b", "c", "d", "e"]
    assert all(set(p.ranks) <= {0, 1} for p in planned.values())


def _problem(element: int = 4, optimizer: str = "sgd"):
    from tests.test_solver import random_problem

    problem = random_problem(12, 2, seed=4)
    # fp32 (or fp16) rows and their optimizer state, as TorchRec's tables hold them; the HBM
    # scaled as the rows (4x for fp32 rows without state) keeps the same pressure
    hw = dataclasses.replace(
        problem.hardware, batch_size=4096, bytes_per_element=element, optimizer=optimizer
    )
    scale = hw.row_bytes(16) / 16
    hw = dataclasses.replace(hw, hbm_bytes_per_gpu=int(problem.hardware.hbm_bytes_per_gpu * scale))
    tables = tuple(dataclasses.replace(t, row_bytes=float(hw.row_bytes(t.dim))) for t in problem.tables)
    return dataclasses.replace(problem, tables=tables, hardware=hw)


def test_torchrec_plans_are_costed_shard_by_shard_in_our_model():
    from recshard_stats.manifest import TorchRecShard as Shard
    from recshard_stats.solver.plan import Plan, cost_plan
    from recshard_stats.torchrec_planner import cost_torchrec_plan

    problem = _problem()
    whole = [
        Shard(t.name, "table_wise", ComputeKernel.FUSED, j % 2, t.hash_size, t.dim)
        for j, t in enumerate(problem.tables)
    ]
    expected = cost_plan(
        problem, Plan("p", tuple(j % 2 for j in range(12)), tuple(t.hash_size for t in problem.tables))
    )
    assert cost_torchrec_plan(problem, whole).gpu_cost == pytest.approx(expected.gpu_cost)
    # a table split in two row shards: each rank serves the lookups of its half; a cached one is
    # served from HBM as far as its hottest load-factor share of rows reaches; two column shards
    # each serve every lookup on half the bytes; a data-parallel table serves 1/G on each rank
    t = problem.tables[0]
    half = t.hash_size // 2
    rows = [
        Shard(t.name, "row_wise", ComputeKernel.FUSED, 0, half, t.dim),
        Shard(t.name, "row_wise", ComputeKernel.FUSED, 1, t.hash_size - half, t.dim),
    ]
    full = problem.table_cost(0, t.hash_size)
    assert cost_torchrec_plan(problem, rows).gpu_cost == pytest.approx(
        (half / t.hash_size * full, (t.hash_size - half) / t.hash_size * full)
    )
    cached = [Shard(t.name, "table_wise", "fused_uvm_caching", 1, t.hash_size, t.dim, cache_load_factor=0.1)]
    assert cost_torchrec_plan(problem, cached).gpu_cost[1] == pytest.approx(
        problem.table_cost(0, 0.1 * t.hash_size)
    )
    columns = [
        Shard(t.name, "column_wise", ComputeKernel.FUSED_UVM, g, t.hash_size, t.dim // 2) for g in (0, 1)
    ]
    assert cost_torchrec_plan(problem, columns).gpu_cost == pytest.approx((problem.uvm_time(0) / 2,) * 2)
    replicated = [Shard(t.name, "data_parallel", ComputeKernel.FUSED, g, t.hash_size, t.dim) for g in (0, 1)]
    assert cost_torchrec_plan(problem, replicated).gpu_cost == pytest.approx((full / 2,) * 2)


def test_torchrecs_planner_is_a_baseline_rated_in_both_models():
    from recshard_stats.solver.baselines import greedy
    from recshard_stats.solver.plan import cost_plan
    from recshard_stats.solver.solve import polish
    from recshard_stats.torchrec_planner import rate_in_torchrec, torchrec_baselines

    problem = _problem()
    results = {b.name: b for b in torchrec_baselines(problem)}
    assert set(results) == {"torchrec_default", "torchrec_stats"}
    for b in results.values():
        assert b.error is None, b.error
        assert sum(b.layouts.values()) == len(problem.tables) and b.torchrec_rating_ms > 0
        assert 0 <= b.cost.uvm_access_fraction <= 1 and b.cost.max_cost > 0
    plan = polish(problem, greedy(problem, "size"))
    rating = rate_in_torchrec(problem, plan.gpu, plan.rows_hbm)
    assert rating.rating_ms > 0
    weights = cost_plan(problem, plan).gpu_hbm_bytes
    assert all(
        need >= w for need, w in zip(rating.hbm_needed, weights, strict=True)
    )  # weights and more (inputs, outputs)


@pytest.mark.parametrize(
    "element, optimizer",
    [
        (4, "sgd"),
        pytest.param(2, "sgd", marks=pytest.mark.slow),
        pytest.param(4, "adam", marks=pytest.mark.slow),
    ],
)
def test_a_solved_plan_fits_torchrecs_storage_estimate(element, optimizer):
    """The solver keeps HBM for the trainer's ids and pooled outputs: its plan fits TorchRec's own
    storage estimate for the same ranks and kernels (the static split's parts, in the weights'
    data type: fp16 rows planned as fp16 tables); the same solve without them fills HBM with rows
    and overflows it."""
    from recshard_stats.solver.column_split import table_shards
    from recshard_stats.solver.solve import solve_problem
    from recshard_stats.torchrec_planner import rate_in_torchrec

    base = _problem(element, optimizer)
    with_buffers = dataclasses.replace(
        base, hardware=dataclasses.replace(base.hardware, index_bytes=8, output_bytes_per_element=4)
    )
    from recshard_stats.options import SolveOptions

    options = SolveOptions(solver="highs", time_limit_s=20, mip_gap=0.01)
    ratings = {}
    for name, problem in (("buffers", with_buffers), ("rows only", base)):
        outcome = solve_problem(problem, options)
        placed, plan = outcome.placed or problem, outcome.best.plan
        # per model table (a table cut into column shards: its GPUs, its shards' rows)
        shards = table_shards(placed, plan)
        assert any(0 < s.rows_hbm < t.hash_size for s, t in zip(shards, problem.tables, strict=True))
        ratings[name] = rate_in_torchrec(
            problem, tuple(s.gpus for s in shards), tuple(s.rows_hbm for s in shards)
        )
        # and still uses the HBM it has: on every GPU holding a table with rows worth moving left
        # in host memory, rows fill what the buffers leave (to within one row)
        weights = [0.0] * problem.num_gpus
        for j, t in enumerate(placed.tables):
            weights[plan.gpu[j]] += plan.rows_hbm[j] * t.row_bytes
        worth = [
            t.hbm_fraction(plan.rows_hbm[j] + 1) > t.hbm_fraction(plan.rows_hbm[j])
            for j, t in enumerate(placed.tables)
        ]
        for g in {
            plan.gpu[j] for j, t in enumerate(placed.tables) if plan.rows_hbm[j] < t.hash_size and worth[j]
        }:
            left = placed.rows_capacity([j for j in range(len(placed.tables)) if plan.gpu[j] == g])
            assert left - max(t.row_bytes for t in placed.tables) <= weights[g] <= left, (g, weights, left)
    fitted, unfitted = ratings["buffers"], ratings["rows only"]
    assert fitted.fits, (fitted.hbm_needed, fitted.hbm_usable)
    assert not unfitted.fits


def test_torchrec_gets_its_bandwidths_in_bytes_per_ms():
    """TorchRec's Topology takes bandwidths in bytes/ms. A hardware config holding TorchRec's own
    default bandwidths (as bytes/s) must give the adapter's Topology exactly those defaults, and
    TorchRec's estimate of a table planned on it must equal the one on TorchRec's default
    Topology (a bytes/s slip makes the compute estimates 1000x too small)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.planner.constants import HBM_MEM_BW, HBM_TO_DDR_MEM_BW
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.types import ParameterConstraints

    from recshard_stats.torchrec_planner import _topology

    base = _problem()
    problem = dataclasses.replace(
        base,
        hardware=dataclasses.replace(
            base.hardware, hbm_bandwidth=HBM_MEM_BW * 1000, uvm_bandwidth=HBM_TO_DDR_MEM_BW * 1000
        ),
    )
    ours = _topology(problem)
    hw = problem.hardware
    theirs = Topology(
        world_size=hw.num_gpus,
        compute_device="cuda",
        hbm_cap=hw.hbm_bytes_per_gpu,
        ddr_cap=hw.host_bytes // hw.num_gpus,
        local_world_size=hw.num_gpus,
    )
    assert ours.hbm_mem_bw == pytest.approx(HBM_MEM_BW) and ours.hbm_to_ddr_mem_bw == pytest.approx(
        HBM_TO_DDR_MEM_BW
    )
    t = problem.tables[0]
    collection = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name, embedding_dim=t.dim, num_embeddings=t.hash_size, feature_names=list(t.features)
            )
        ],
        device=torch.device("meta"),
    )
    perf = {}
    for name, topology in (("ours", ours), ("theirs", theirs)):
        for kernel in (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM):
            constraints = {
                t.name: ParameterConstraints(
                    sharding_types=["table_wise"], compute_kernels=[kernel], pooling_factors=[5.0]
                )
            }
            (option,) = EmbeddingEnumerator(topology, 1024, constraints).enumerate(
                collection, [EmbeddingBagCollectionSharder()]
            )
            perf[name, kernel] = option.shards[0].perf
    for kernel in (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM):
        assert perf["ours", kernel].fwd_compute == pytest.approx(perf["theirs", kernel].fwd_compute, rel=1e-9)
        assert perf["ours", kernel].total == pytest.approx(perf["theirs", kernel].total, rel=1e-9)
    # and in TorchRec's unit: 1024 x 5 lookups of dim x 4 bytes from UVM at 32 GiB/s take about that long
    moved = 1024 * 5 * t.dim * 4
    assert perf["ours", ComputeKernel.FUSED_UVM].fwd_compute >= moved / HBM_TO_DDR_MEM_BW


def test_ids_outside_a_table_and_missing_features_are_refused_in_the_tables_terms(loaded):
    from recshard_stats.torchrec_trainer import _check_ids

    split = StaticSplitEmbeddingBagCollection(loaded)
    kjt = _batch(loaded, np.random.default_rng(3))
    by_feature = kjt.to_dict()
    for feature, bad in (("fa", -1), ("fb", 40)):  # 'a' is split (the remap would alias -1), 'b' whole
        names = list(by_feature)
        values = [by_feature[f].values() for f in names]
        i = names.index(feature)
        values[i] = torch.cat([values[i], torch.tensor([bad])])
        lengths = [by_feature[f].lengths().clone() for f in names]
        lengths[i][-1] += 1
        bad_kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        table = loaded.manifest.table(feature[1])
        with pytest.raises(
            RecShardError,
            match=rf"feature '{feature}': id {bad} is outside table '{table.name}' "
            rf"\(rows 0..{table.hash_size - 1}, hash_size {table.hash_size}\)",
        ):
            split(bad_kjt)
    _check_ids(loaded.manifest.table("a"), "fa", torch.tensor([0, 49]))  # the edges are rows
    partial = KeyedJaggedTensor.from_lengths_sync(
        keys=["fa"], values=by_feature["fa"].values(), lengths=by_feature["fa"].lengths()
    )
    with pytest.raises(RecShardError, match=r"the batch lacks feature\(s\) \['fb', 'fc', 'd1', 'd2', 'fe'\]"):
        split(partial)


def test_the_model_and_the_process_group_are_checked_against_the_manifest(loaded):
    from torch import nn

    from recshard_stats.torchrec_trainer import check_collection, check_world_size, table_configs

    class Model(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.sparse = sparse

    split = StaticSplitEmbeddingBagCollection(loaded, device=torch.device("meta"))
    model = Model(split)
    assert check_collection(model, loaded.manifest, "sparse") is split.collection  # the split module's own
    assert check_collection(model, loaded.manifest, "sparse.collection") is split.collection
    with pytest.raises(RecShardError, match=r"module_path 'dense' names no module .*\['sparse.collection'\]"):
        check_collection(model, loaded.manifest, "dense")
    fewer = loaded.restricted(["a", "b", "c", "d"])  # a collection without table 'e'
    other = Model(StaticSplitEmbeddingBagCollection(fewer, device=torch.device("meta")))
    with pytest.raises(RecShardError, match=r"lacks the manifest's table\(s\) \['e'\]"):
        check_collection(other, loaded.manifest, "sparse")
    with pytest.raises(RecShardError, match=r"has table\(s\) \['e'\] the manifest does not plan"):
        check_collection(model, fewer.manifest, "sparse")
    plain = Model(
        EmbeddingBagCollection(
            tables=table_configs(loaded.manifest, split=False), device=torch.device("meta")
        )
    )
    check_collection(plain, loaded.manifest, "sparse", split=False)
    with pytest.raises(  # the split tables' parts are not in a collection of whole tables
        RecShardError, match=r"lacks the manifest's table\(s\) \['a', 'd', 'e'\] \(the split layout's parts\)"
    ):
        check_collection(plain, loaded.manifest, "sparse")
    check_world_size(loaded.manifest, 2)
    for world in (1, 4):
        with pytest.raises(
            RecShardError, match=rf"the manifest plans 2 ranks \(GPUs 0..1\), the process group has {world}"
        ):
            check_world_size(loaded.manifest, world)


def test_a_restricted_manifest_plans_its_tables_as_before(loaded):
    fewer = loaded.restricted(["d", "a"])
    m = fewer.manifest
    assert [t.name for t in m.tables] == ["a", "d"]  # manifest order
    assert [g.tables for g in m.gpus] == [("a", "d"), ()]
    assert m.gpus[0].hbm_bytes_used == round(sum(t.rows_hbm * t.row_bytes for t in m.tables))
    assert m.plan.objective_ms == pytest.approx(sum(t.predicted_cost_ms for t in m.tables))
    assert Manifest.from_json(m.to_json()) == m  # it validates
    assert {t.name for t in m.model.tables} == {"a", "d"}
    unsplit = _unsplit(fewer, PoolingType.SUM)
    split = _split(fewer, PoolingType.SUM, unsplit)
    kjt = _batch(fewer, np.random.default_rng(4))
    torch.testing.assert_close(split(kjt).values(), unsplit(kjt).values())
    with pytest.raises(RecShardError, match=r"cannot restrict the manifest to \['z'\]"):
        loaded.restricted(["a", "z"])


@pytest.mark.slow  # shares the `recshard run` above
def test_a_copied_run_finds_its_stats_from_the_manifest(run_manifest, tmp_path):
    import shutil

    from recshard_stats.stats_reader import load_stats, stats_digest

    run = run_manifest.parent.parent  # <run>/manifests/ds=...
    assert not pathlib.Path(load_manifest(run_manifest).manifest.inputs.stats).is_absolute()
    copy = tmp_path / "moved"
    shutil.copytree(run, copy)
    loaded = load_manifest(copy / "manifests" / run_manifest.name)
    assert pathlib.Path(loaded.stats_path).resolve().is_relative_to(copy.resolve())
    assert stats_digest(load_stats(loaded.stats_path)) == loaded.manifest.inputs.stats_digest


def test_fp16_plans_build_fp16_tables_and_a_fp32_module_is_refused(tmp_path):
    """bytes_per_element 2 flows from the hardware config in the manifest to every TorchRec
    object (and torchrec_plan.json); a collection in another data type is an error."""
    from torch import nn
    from torchrec.modules.embedding_configs import DataType

    from recshard_stats.export import torchrec_plan
    from recshard_stats.torchrec_trainer import check_collection, table_configs

    fp32 = _manifest_dir(tmp_path)
    manifest = dataclasses.replace(
        fp32.manifest, hardware=dataclasses.replace(fp32.manifest.hardware, bytes_per_element=2)
    )
    half = ManifestFile(fp32.path, manifest)
    assert {c.data_type for c in table_configs(manifest)} == {DataType.FP16}
    assert {c.data_type for c in table_configs(manifest, split=False)} == {DataType.FP16}
    assert (
        torchrec_plan(manifest)["data_type"] == "fp16" and torchrec_plan(fp32.manifest)["data_type"] == "fp32"
    )
    split = StaticSplitEmbeddingBagCollection(half)
    assert {p.dtype for p in split.collection.parameters()} == {torch.float16}
    unsplit = EmbeddingBagCollection(tables=table_configs(manifest, split=False))
    weights = {t.name: unsplit.embedding_bags[t.name].weight.detach() for t in manifest.tables}
    split.collection.load_state_dict(split_state_dict(half, weights))
    kjt = _batch(half, np.random.default_rng(5))
    torch.testing.assert_close(
        split(kjt).values().float(), unsplit(kjt).values().float(), rtol=2e-3, atol=2e-3
    )

    class Model(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.sparse = sparse

    with pytest.raises(
        RecShardError,
        match=r"table 'a': the collection's 'a__hbm' holds FP32 weights, the manifest was solved for FP16",
    ):
        check_collection(
            Model(StaticSplitEmbeddingBagCollection(fp32, device=torch.device("meta"))), manifest, "sparse"
        )


def test_torchrec_plan_json_states_the_static_split_that_runs(loaded):
    from recshard_stats.export import torchrec_plan

    plan = torchrec_plan(loaded.manifest)
    assert plan["layout"] == "static_split" and plan["version"] == 3
    assert "fused_uvm_caching" not in json.dumps(plan) and "cache_load_factor" not in json.dumps(plan)
    a, b, c = (plan["tables"][n] for n in "abc")
    assert a["parts"] == [
        {"name": "a__hbm", "compute_kernel": "fused", "num_embeddings": 20, "first_row": 0},
        {"name": "a__uvm", "compute_kernel": "fused_uvm", "num_embeddings": 30, "first_row": 20},
    ]
    assert b["parts"] == [{"name": "b", "compute_kernel": "fused", "num_embeddings": 40, "first_row": 0}]
    assert c["parts"] == [{"name": "c", "compute_kernel": "fused_uvm", "num_embeddings": 30, "first_row": 0}]
    # the parts are the split layout the trainer builds
    assert [p["name"] for t in plan["tables"].values() for p in t["parts"]] == [
        p.name for p in split_parts(loaded.manifest)
    ]


def _fused_optimizer_worker(rank: int, port: int, manifest_dir: str, lr: float, results) -> None:
    """One rank: the split collection fused with the manifest's optimizer by apply_optimizer,
    sharded by distributed_model_parallel, one forward + backward (the fused optimizer steps in
    the backward); the unsplit weights before and after, and the fused optimizer's state keys."""
    import os

    import torch.distributed as dist
    from torch import nn

    from recshard_stats.torchrec_trainer import apply_optimizer, distributed_model_parallel

    class Model(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.sparse = sparse

        def forward(self, kjt):
            return self.sparse(kjt)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    try:
        loaded = load_manifest(manifest_dir)
        torch.manual_seed(0)
        model = Model(StaticSplitEmbeddingBagCollection(loaded))
        apply_optimizer(model, loaded, "sparse", lr=lr, eps=1e-8)
        dmp = distributed_model_parallel(model, loaded, "sparse", device=torch.device("cpu"))

        def weights():  # DMP initialises the shards anew: read them from it
            local = {
                k.split("sparse.collection.", 1)[1]: v.local_shards()[0].tensor.clone()
                for k, v in dmp.state_dict().items()
            }
            return unsplit_state_dict(loaded, local)

        before = weights()
        kjt = _batch(loaded, np.random.default_rng(3))
        dmp(kjt).values().sum().backward()
        after = weights()
        ids = {f: kjt[f].values().numpy() for f in kjt.keys()}  # noqa: SIM118 (a KJT, not a dict)
        arrays = [{k: v.detach().float().numpy().copy() for k, v in d.items()} for d in (before, after)]
        results.put(
            (*arrays, ids, sorted(k for v in dmp.fused_optimizer.state_dict()["state"].values() for k in v))
        )
    finally:
        dist.destroy_process_group()


def _manifest_with(loaded: ManifestFile, **hardware) -> ManifestFile:
    manifest = dataclasses.replace(
        loaded.manifest, hardware=dataclasses.replace(loaded.manifest.hardware, **hardware)
    )
    (loaded.path.parent / "manifest.json").write_text(manifest.to_json())
    return load_manifest(loaded.path.parent)


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "sgd"])
def test_the_manifests_optimizer_is_the_one_torchrec_fuses(tmp_path, optimizer):
    """The hardware config's optimizer reaches DMP's fused optimizer: one step on a batch whose
    pooled sum is the loss moves each looked-up row by lr (row-wise Adagrad: a row's gradient
    is its lookup count in every column, scaled to one) or by lr x its lookup count (SGD),
    computed here from the ids alone."""
    import socket

    import torch.multiprocessing as mp

    one_gpu = [("a", ("fa",), 0, 50, 8, 20, 30), ("b", ("fb",), 0, 40, 8, 40, 25)]
    loaded = _manifest_with(
        write_manifest_dir(tmp_path / "ds=2026-12-01", one_gpu, num_gpus=1), optimizer=optimizer
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    lr = 0.5
    mp.start_processes(
        _fused_optimizer_worker,
        args=(port, str(loaded.path.parent), lr, results),
        nprocs=1,
        start_method="spawn",
    )
    before, after, ids, state = results.get()
    for name, feature in (("a", "fa"), ("b", "fb")):
        counts = np.bincount(ids[feature], minlength=before[name].shape[0]).astype(np.float32)
        step = (counts > 0) if optimizer == "rowwise_adagrad" else counts
        expected = before[name] - lr * step[:, None]
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-5)
    # row-wise Adagrad keeps one momentum per row of each part; SGD keeps none
    momenta = [key for key in state if "momentum1" in key]
    assert (len(momenta) > 0) == (optimizer == "rowwise_adagrad"), state


def test_a_collection_fused_with_another_optimizer_is_refused(tmp_path):
    """A mismatch between the manifest's optimizer and the module's is an error naming both; a
    collection with none fused is refused for a manifest whose optimizer keeps state (its HBM
    was planned for it) and accepted for sgd (TorchRec's default)."""
    from torch import nn
    from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

    from recshard_stats.torchrec_trainer import apply_optimizer, check_optimizer

    sgd = _manifest_dir(tmp_path)
    rowwise = _manifest_with(sgd, optimizer="rowwise_adagrad")
    collection = StaticSplitEmbeddingBagCollection(sgd, device=torch.device("meta")).collection
    check_optimizer(collection, sgd.manifest)
    with pytest.raises(
        RecShardError, match=r"trains with no optimizer fused.*solved for rowwise_adagrad"
    ) as err:
        check_optimizer(collection, rowwise.manifest)
    assert "apply_optimizer(model, loaded, module_path" in err.value.render()
    apply_optimizer_in_backward(torch.optim.Adam, collection.parameters(), {"lr": 0.1})
    with pytest.raises(
        RecShardError,
        match=r"table 'a' trains with Adam \(ADAM\), the manifest was solved for sgd \(EXACT_SGD\)",
    ):
        check_optimizer(collection, sgd.manifest)

    class Model(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.sparse = sparse

    model = Model(StaticSplitEmbeddingBagCollection(rowwise, device=torch.device("meta")))
    apply_optimizer(model, rowwise, "sparse", lr=0.1)
    check_optimizer(model.sparse.collection, rowwise.manifest)
    with pytest.raises(RecShardError, match=r"RowWiseAdagrad \(EXACT_ROWWISE_ADAGRAD\).*solved for sgd"):
        check_optimizer(model.sparse.collection, sgd.manifest)


def test_torchrecs_storage_estimate_counts_the_optimizers_state(tmp_path):
    """torchrec_plan.json names FBGEMM's optimizer and each table's state per row, and TorchRec's
    storage estimate of a plan counts the state: Adam adds twice a whole-HBM table's weights
    (TorchRec's own rule for Adam), row-wise Adagrad one value per row."""
    from recshard_stats.export import torchrec_plan
    from recshard_stats.torchrec_planner import rate_in_torchrec

    loaded = _manifest_with(_manifest_dir(tmp_path), optimizer="rowwise_adagrad")
    plan = torchrec_plan(loaded.manifest)
    assert plan["optimizer"] == "EXACT_ROWWISE_ADAGRAD" and plan["version"] == 3
    assert {n: t["optimizer_state_bytes_per_row"] for n, t in plan["tables"].items()} == dict.fromkeys(
        "abcde", 4
    )
    adam = torchrec_plan(_manifest_with(loaded, optimizer="adam").manifest)
    assert adam["optimizer"] == "ADAM" and adam["tables"]["a"]["optimizer_state_bytes_per_row"] == 2 * 4 * 8

    base = _problem()
    t = base.tables[0]
    needed = {}
    for optimizer in ("sgd", "adam", "rowwise_adagrad"):
        problem = dataclasses.replace(base, hardware=dataclasses.replace(base.hardware, optimizer=optimizer))
        needed[optimizer] = rate_in_torchrec(
            problem, (0,) + (1,) * 11, (t.hash_size,) + (0,) * 11
        ).hbm_needed[0]
    weights = t.hash_size * t.dim * 4
    assert needed["adam"] - needed["sgd"] == 2 * weights
    assert needed["rowwise_adagrad"] - needed["sgd"] == t.hash_size * 4


def test_torchrecs_planner_is_not_started_when_its_enumeration_would_overrun_its_limit():
    """TorchRec checks its time limit only after enumerating every sharding over every rank: at
    100,000 ranks that alone takes many minutes, so the baseline is reported as not run, with
    the estimate, instead of hanging the solve."""
    from recshard_stats.torchrec_planner import torchrec_baselines

    base = _problem()
    problem = dataclasses.replace(
        base, tables=base.tables[:3], hardware=dataclasses.replace(base.hardware, num_gpus=100_000)
    )
    results = torchrec_baselines(problem, timeout_s=5)
    assert [b.name for b in results] == ["torchrec_default", "torchrec_stats"]
    for b in results:
        assert b.error is not None and b.error.startswith("not run: enumerating 3 tables over 100000 ranks")
        assert "before its 5s time limit applies" in b.error
        assert b.shards == () and b.planning_seconds == 0.0
