"""Reading checkpoints back (CheckpointReader, read_checkpoint) and
rewriting them for another server count (reshard_checkpoint)."""

from __future__ import annotations

from typing import IO, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import capi as _c
from ._arrays import DTYPES, _NUMPY, Shape
from ._handles import _Closing, _Handle


class CheckpointReader(_Closing):
    """Reads a checkpoint: a ckpt-* directory, a server's checkpoint directory
    (its newest checkpoint) or a directory of shard directories (the newest
    checkpoint of each, with parameters put back together from their blocks).

    >>> with pserver.CheckpointReader("/ckpt") as r:      # doctest: +SKIP
    ...     for name in r: print(name, r.info(name))
    ...     w = r.read("w")
    ...     r.verify()                                      # every checksum
    """

    def __init__(self, path: str) -> None:
        self._path = str(path)
        ptr = _c.pserver_checkpoint_reader_new(self._path)
        self._names = [_c.pserver_checkpoint_reader_param_name(ptr, i)
                       for i in range(_c.pserver_checkpoint_reader_num_params(ptr))]
        self._paths = [_c.pserver_checkpoint_reader_checkpoint_path(ptr, i)
                       for i in range(_c.pserver_checkpoint_reader_num_checkpoints(ptr))]
        self._h = _Handle(ptr, _c.pserver_checkpoint_reader_delete, "checkpoint reader")

    @property
    def checkpoints(self) -> List[str]:
        """The checkpoint directories opened (one per shard)."""
        return list(self._paths)

    def names(self) -> List[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def info(self, name: str) -> Tuple[np.dtype, Shape]:
        with self._h.use() as h:
            code, shape = _c.pserver_checkpoint_reader_param_info(h, name)
        return _NUMPY[code], tuple(shape)

    def read(self, name: str) -> np.ndarray:
        """Parameter `name`, every checksum of its data verified."""
        dtype, shape = self.info(name)
        out = np.empty(shape, dtype)
        with self._h.use() as h:
            _c.pserver_checkpoint_reader_read(h, name, DTYPES[dtype], out)
        return out

    def read_all(self) -> Dict[str, np.ndarray]:
        return {name: self.read(name) for name in self._names}

    def tables(self) -> List[str]:
        """The tables in the checkpoints (sparse and KV tables), sorted."""
        with self._h.use() as h:
            return [_c.pserver_checkpoint_reader_table_name(h, i)
                    for i in range(_c.pserver_checkpoint_reader_num_tables(h))]

    def read_table(self, name: str) -> Tuple[np.ndarray, np.ndarray]:
        """Table `name`'s rows over every shard, sorted by key: (keys, uint64
        of shape (rows,); values, float32 or float64 of shape (rows, dim)).
        Raises NotFound for an unknown table, DataLoss for damaged data."""
        with self._h.use() as h:
            dim, code, rows = _c.pserver_checkpoint_reader_table_info(h, name)
            keys = np.empty(rows, np.uint64)
            values = np.empty((rows, dim), _NUMPY[code])
            _c.pserver_checkpoint_reader_read_table(h, name, keys, values)
        return keys, values

    def verify(self) -> None:
        """Verifies every data file and chunk; raises DataLoss naming the file."""
        with self._h.use() as h:
            _c.pserver_checkpoint_reader_verify(h)

    def close(self) -> None:
        self._h.close()


    def __repr__(self) -> str:
        return f"<pserver.CheckpointReader {self._path}: {len(self._names)} parameters " \
               f"in {len(self._paths)} checkpoint(s)>"


def read_checkpoint(path: str, *, verify: bool = True) -> Dict[str, np.ndarray]:
    """Every parameter of the checkpoint at `path` as numpy arrays, by name.

    With `verify` (the default) every data file and chunk is checked first;
    damage raises :class:`DataLoss` naming the file.

    >>> params = pserver.read_checkpoint("/ckpt")   # doctest: +SKIP
    >>> params["w"].dtype, params["w"].shape        # doctest: +SKIP
    (dtype('float32'), (2, 3))
    """
    with CheckpointReader(path) as reader:
        if verify:
            reader.verify()
        return reader.read_all()


def reshard_checkpoint(from_dir: str, to_dir: str, servers: int,
                       progress: Optional[IO] = None) -> None:
    """Rewrites the checkpoints a stopped cluster of N servers wrote into
    `from_dir` (its checkpoint_dir: shard-0 .. shard-<N-1>) for `servers`
    (M, 1 .. 4096) servers, into `to_dir` (new or empty), which M servers
    then load: every parameter block, table row with its optimizer state and
    held-back BSP add goes where M servers look for it; exactly-once sets are
    dropped (restart the job's clients). Progress lines go to `progress` (a
    file with a fileno(), e.g. sys.stderr; None: none). Raises
    FailedPrecondition for a missing shard, mixed clusters or server counts
    or a `to_dir` that is not empty, NotFound when `from_dir` holds no
    checkpoint, DataLoss when no checkpoint of a shard verifies; nothing is
    left at `to_dir` then. docs/checkpoint-format.md, "Resharding".

    >>> pserver.reshard_checkpoint("/ckpt/job", "/ckpt/job-5", 5)  # doctest: +SKIP
    """
    fd = -1
    if progress is not None:
        progress.flush()
        fd = progress.fileno()
    if not 1 <= servers <= 0xFFFFFFFF:
        servers = 0  # out of range: the library names it
    _c.pserver_checkpoint_reshard(str(from_dir), str(to_dir), servers, fd)
