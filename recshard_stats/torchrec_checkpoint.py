"""Sharded checkpoints of a model sharded from a manifest (the ``torchrec`` extra): each rank
reads and writes only its own rows, through ``torch.distributed.checkpoint`` (DCP).

A checkpoint holds every manifest table in its own layout: ``embedding_bags.<table>.weight``,
``[hash_size, dim]`` in hashed-row order, whatever the plan that wrote it. So it loads under
another plan (another day's remap, other ranks, another world size) and into a plain TorchRec
``EmbeddingBagCollection`` of the unsplit tables (``dcp.load`` with those keys).

How: on save, each rank sends the rows of its shards (the split layout's HBM and UVM parts,
whole tables or column shards of them) to the rank whose block of the table's hashed rows holds
them (``torch.chunk`` blocks over the world), one ``all_to_all`` per table; the blocks are
written by DCP as a row-wise ``ShardedTensor``. Load is the reverse: DCP reads each rank's block,
and an ``all_to_all`` sends each row to the shards that hold it under the loading plan. Tables
go one at a time: a rank holds, beyond its shards, one table's block and send/receive buffers
of its rows of that table, never a whole table. ``recshard_checkpoint.json`` beside DCP's files
names each table's hash_size, dim and hash function; a load under a manifest that disagrees is
refused, naming the table.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, init_from_local_shards
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import TablePlacement
from recshard_stats.manifest_loader import ManifestFile
from recshard_stats.torchrec_trainer import StaticSplitEmbeddingBagCollection, is_split, split_parts

CHECKPOINT_INFO = "recshard_checkpoint.json"
PIECE_BYTES = 4 * 2**20  # rows in flight per rank and round, and the size of the pieces a block
# is written as (a reader under another world size reads the pieces that overlap its own)


@dataclasses.dataclass(frozen=True)
class _ShardRows:
    """One shard of the loaded plan (on any rank): its rows, as positions of the table's remap
    order (a whole table's are its hashed rows), and its columns."""

    rank: int
    key: str  # its state-dict key
    first_row: int  # its first row within its part (the shard's row offset)
    first_position: int  # the remap position of its row 0
    rows: int
    first_column: int
    columns: int


def _collection_prefix(model: nn.Module, module_path: str) -> str:
    """The state-dict prefix of the sharded collection: a split module's ``collection``."""
    inner: nn.Module = getattr(model, "module", model)  # DMP wraps the model
    module = inner.get_submodule(module_path)
    path = module_path
    if isinstance(module, StaticSplitEmbeddingBagCollection):
        path = f"{module_path}.collection" if module_path else "collection"
    return f"{path}." if path else ""


def _positions(loaded: ManifestFile, t: TablePlacement) -> np.ndarray | None:
    """Each hashed row's position in the split layout's order (None: a whole table, in its
    hashed order)."""
    if not is_split(t):
        return None
    return loaded.new_index(t.name, np.arange(t.hash_size, dtype=np.int64))


def _table_shards(loaded: ManifestFile, t: TablePlacement, state: dict, prefix: str) -> list[_ShardRows]:
    """Every shard of the table's parts, on every rank, in one order all ranks agree on."""
    out = []
    for part in (p for p in split_parts(loaded.manifest) if p.table == t.name):
        key = f"{prefix}embedding_bags.{part.name}.weight"
        if key not in state or not isinstance(state[key], ShardedTensor):
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"table {t.name!r}: the model has no sharded {key!r}",
                fixes=("shard the model with distributed_model_parallel(model, loaded, module_path)",),
            )
        for m in state[key].metadata().shards_metadata:
            (row, column), (rows, columns) = m.shard_offsets, m.shard_sizes
            out.append(_ShardRows(m.placement.rank(), key, row, part.first_row + row, rows, column, columns))
    return out


def _local_tensors(state: dict, shards: list[_ShardRows], rank: int) -> list[torch.Tensor]:
    """This rank's shard tensors, in the order of ``shards``."""
    local = {
        (key, *s.metadata.shard_offsets): s.tensor
        for key in {r.key for r in shards}
        for s in state[key].local_shards()
    }
    return [local[(r.key, r.first_row, r.first_column)] for r in shards if r.rank == rank]


def _block_bounds(hash_size: int, world: int) -> np.ndarray:
    """``torch.chunk`` blocks of a table's rows over the ranks: block q is rows [b[q], b[q+1])."""
    chunk = -(-hash_size // world)
    return np.minimum(np.arange(world + 1, dtype=np.int64) * chunk, hash_size)


def _piece_rows(t: TablePlacement, element_size: int) -> int:
    return max(1, PIECE_BYTES // max(1, t.dim * element_size))


def _rounds(bounds: np.ndarray, piece: int):
    """Per round, each rank's range of hashed rows: the next piece of its block (every rank
    takes part in every round, with an empty range once its block is done)."""
    starts, ends = bounds[:-1], bounds[1:]
    for k in range(int(-(-(ends - starts).max() // piece))):
        low = np.minimum(starts + k * piece, ends)
        yield low, np.minimum(low + piece, ends)


def _exchange(
    shards: list[_ShardRows],
    tensors: list[torch.Tensor],
    positions: np.ndarray | None,
    piece: torch.Tensor,
    low: np.ndarray,
    high: np.ndarray,
    rank: int,
    group,
    to_pieces: bool,
) -> None:
    """Move the rows of one round (rank q's hashed rows [low[q], high[q])) between the plan's
    shards and the ranks' pieces, one ``all_to_all``: ``to_pieces`` shards -> ``piece`` (save),
    else ``piece`` -> shards (load). Per (shard, piece) the rows go in hashed-row order; buffers
    are peer-major, shards in the agreed order. Work per round: its rows, not the table's."""
    world = len(low)

    def rows_between(i: int, q: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard i's rows in rank q's piece: (shard rows, piece rows)."""
        hashed = np.arange(low[q], high[q])
        at = hashed if positions is None else positions[low[q] : high[q]]
        s = shards[i]
        inside = np.flatnonzero((at >= s.first_position) & (at < s.first_position + s.rows))
        return at[inside] - s.first_position, inside

    mine = [i for i, s in enumerate(shards) if s.rank == rank]
    out_rows = {(i, q): rows_between(i, q) for i in mine for q in range(world)}  # my shards, each piece
    in_rows = {(i, rank): out_rows.get((i, rank)) or rows_between(i, rank) for i in range(len(shards))}
    send_sizes, recv_sizes = [0] * world, [0] * world
    for (i, q), (rows, _) in out_rows.items():
        (send_sizes if to_pieces else recv_sizes)[q] += len(rows) * shards[i].columns
    for (i, _), (rows, _) in in_rows.items():
        (recv_sizes if to_pieces else send_sizes)[shards[i].rank] += len(rows) * shards[i].columns
    send = torch.empty(sum(send_sizes), dtype=piece.dtype)
    recv = torch.empty(sum(recv_sizes), dtype=piece.dtype)

    def columns(i: int) -> slice:
        return slice(shards[i].first_column, shards[i].first_column + shards[i].columns)

    offset = 0
    for q in range(world):
        for i in mine if to_pieces else (i for i, s in enumerate(shards) if s.rank == q):
            if to_pieces:
                values = tensors[mine.index(i)][torch.as_tensor(out_rows[(i, q)][0])].reshape(-1)
            else:
                values = piece[torch.as_tensor(in_rows[(i, rank)][1]), columns(i)].reshape(-1)
            send[offset : offset + values.numel()] = values
            offset += values.numel()
    dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
    del send
    offset = 0
    with torch.no_grad():
        for q in range(world):
            for i in (i for i, s in enumerate(shards) if s.rank == q) if to_pieces else mine:
                width = shards[i].columns
                if to_pieces:
                    at = torch.as_tensor(in_rows[(i, rank)][1])
                    piece[at, columns(i)] = recv[offset : offset + len(at) * width].view(len(at), width)
                else:
                    at = torch.as_tensor(out_rows[(i, q)][0])
                    tensors[mine.index(i)][at] = recv[offset : offset + len(at) * width].view(len(at), width)
                offset += len(at) * width


def _sharded_rows(
    t: TablePlacement, rows: torch.Tensor, first: int, piece: int, rank: int, group
) -> ShardedTensor:
    """A rank's block ``rows`` (the table's hashed rows from ``first``) as a row-wise
    ShardedTensor of the table, in shards of at most ``piece`` rows; collective (ranks without
    rows pass none)."""
    local = [
        Shard.from_tensor_and_offsets(rows[start : start + piece], [first + start, 0], rank)
        for start in range(0, rows.shape[0], piece)
    ]
    return init_from_local_shards(local, [t.hash_size, t.dim], process_group=group)


class _RowsPlanner(DefaultLoadPlanner):
    """DCP's load planner for one piece of one table: reads rows [first, first + len(piece)) of
    the saved ``[hash_size, dim]`` tensor into the piece (DCP's default wants the whole tensor, or
    a ShardedTensor whose shards cover it)."""

    def __init__(self, key: str, first: int):
        super().__init__()
        self.key, self.first = key, first

    def create_local_plan(self) -> LoadPlan:
        saved = self.metadata.state_dict_metadata.get(self.key) if self.metadata else None
        piece = self.state_dict[self.key]
        if not isinstance(saved, TensorStorageMetadata) or saved.size[1:] != piece.shape[1:]:
            raise RecShardError(
                Reason.INPUT_CORRUPT,
                f"the checkpoint's {self.key!r} is {getattr(saved, 'size', 'missing')}, "
                f"not [rows, {piece.shape[1]}]",
            )
        chunk = ChunkStorageMetadata(offsets=torch.Size([self.first, 0]), sizes=piece.shape)
        return LoadPlan(create_read_items_for_chunk_list(self.key, saved, [chunk]))

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[self.key]  # the piece (the read item's offsets are within it)


def _table_key(name: str) -> str:
    return f"embedding_bags.{name}.weight"


def _info(loaded: ManifestFile) -> dict:
    return {
        "layout": "embedding_bags.<table>.weight: [hash_size, dim], hashed-row order",
        "tables": {
            t.name: {"hash_size": t.hash_size, "dim": t.dim, "hash": t.hash} for t in loaded.manifest.tables
        },
    }


def save_sharded(
    model: nn.Module, loaded: ManifestFile, module_path: str, checkpoint_dir, *, group=None
) -> pathlib.Path:
    """Write the sharded model's tables to ``checkpoint_dir`` (a DCP checkpoint on a filesystem
    every rank sees), each rank writing its block of each table only; collective, called on every
    rank. The directory appears whole or not at all (written beside it, renamed by rank 0)."""
    group = group or dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    target = pathlib.Path(checkpoint_dir)
    partial = target.with_name(f"_tmp-{target.name}")
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)  # a killed save's leftovers
    dist.barrier(group)
    state = model.state_dict()
    prefix = _collection_prefix(model, module_path)
    blocks = {}
    for t in loaded.manifest.tables:
        shards, positions = _table_shards(loaded, t, state, prefix), _positions(loaded, t)
        tensors = _local_tensors(state, shards, rank)
        bounds = _block_bounds(t.hash_size, world)
        block = torch.zeros(int(bounds[rank + 1] - bounds[rank]), t.dim, dtype=state[shards[0].key].dtype)
        piece = _piece_rows(t, block.element_size())
        for low, high in _rounds(bounds, piece):  # rows in flight: one piece per rank at a time
            start = int(low[rank] - bounds[rank])
            _exchange(
                shards,
                tensors,
                positions,
                block[start : start + int(high[rank] - low[rank])],
                low,
                high,
                rank,
                group,
                True,
            )
        blocks[_table_key(t.name)] = _sharded_rows(t, block, int(bounds[rank]), piece, rank, group)
    dcp.save(blocks, checkpoint_id=str(partial), process_group=group)
    dist.barrier(group)
    if rank == 0:
        (partial / CHECKPOINT_INFO).write_text(json.dumps(_info(loaded), indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    dist.barrier(group)
    return target


def check_checkpoint(loaded: ManifestFile, checkpoint_dir) -> None:
    """The checkpoint holds every manifest table, with the same rows, dims and hash function."""
    path = pathlib.Path(checkpoint_dir)
    info_path = path / CHECKPOINT_INFO
    if not info_path.is_file():
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"{path} is not a recshard checkpoint (no {CHECKPOINT_INFO})",
            fixes=("write it with recshard_stats.torchrec_checkpoint.save_sharded",),
        )
    saved = json.loads(info_path.read_text())["tables"]
    for t in loaded.manifest.tables:
        want = {"hash_size": t.hash_size, "dim": t.dim, "hash": t.hash}
        if t.name not in saved:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"checkpoint {path} has no table {t.name!r} (it has {sorted(saved)[:10]})",
            )
        if saved[t.name] != want:
            raise RecShardError(
                Reason.MANIFEST_MISMATCH,
                f"table {t.name!r}: checkpoint {path} holds {saved[t.name]}, the manifest plans {want}",
                fixes=("load a checkpoint of the same model config",),
            )


def load_sharded(
    model: nn.Module, loaded: ManifestFile, module_path: str, checkpoint_dir, *, group=None
) -> None:
    """Fill the sharded model's tables from a checkpoint of :func:`save_sharded` (written under
    any plan and world size); collective. Each rank reads one piece of one table at a time (its
    block of the table's hashed rows, piece by piece) and sends its rows to the shards that hold
    them."""
    check_checkpoint(loaded, checkpoint_dir)
    group = group or dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    state = model.state_dict()
    prefix = _collection_prefix(model, module_path)
    for t in loaded.manifest.tables:
        shards, positions = _table_shards(loaded, t, state, prefix), _positions(loaded, t)
        tensors = _local_tensors(state, shards, rank)
        dtype = state[shards[0].key].dtype
        bounds = _block_bounds(t.hash_size, world)
        piece_rows = _piece_rows(t, torch.empty(0, dtype=dtype).element_size())
        for low, high in _rounds(bounds, piece_rows):
            piece = torch.empty(int(high[rank] - low[rank]), t.dim, dtype=dtype)
            key = _table_key(t.name)
            dcp.load(
                {key: piece},
                checkpoint_id=str(checkpoint_dir),
                planner=_RowsPlanner(key, int(low[rank])),
                process_group=group,
            )
            _exchange(shards, tensors, positions, piece, low, high, rank, group, False)
            del piece
