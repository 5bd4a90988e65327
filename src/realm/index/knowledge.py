"""The knowledge of one index version: the base corpus with the blocks added since (`realm index add`) layered
over it, and the ids still live (removed documents keep their rows, so an id means the same block everywhere)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from realm.data.blocks import BlockStore, read_blocks
from realm.index.backends import MipsIndexError


class LayeredStore(BlockStore):
    """The knowledge of one index version, with BlockStore's interface: the base corpus, then the blocks added to
    the index (their ids continue after the corpus, so row = block id still holds), and the version's live ids.
    Blocks of removed documents keep their rows, so an id means the same block in every file of the folder."""

    def __init__(self, base: BlockStore, added: list[Path], live_ids: np.ndarray):
        # No BlockStore.__init__: the base corpus is already read and checked.
        self.folder, self.meta = base.folder, base.meta
        tables = [base.table]
        for path in added:
            table, expected = read_blocks(path), sum(t.num_rows for t in tables)
            first = table.column("block_id")[0].as_py() if table.num_rows else None
            if first != expected:
                raise MipsIndexError(f"{path}: added blocks start at id {first}, expected {expected}")
            tables.append(table)
        self.table = pa.concat_tables(tables)
        self._added = [path.name for path in added]
        self._live = np.sort(live_ids)

    @property
    def live_ids(self) -> np.ndarray:
        return self._live

    @property
    def fingerprint(self) -> str:
        """The base corpus's while nothing was added or removed; else a hash of it, the added files and the live ids."""
        if not self._added and len(self._live) == len(self):
            return self.meta.fingerprint
        digest = hashlib.sha256(json.dumps([self.meta.fingerprint, self._added]).encode())
        digest.update(self._live.tobytes())
        return digest.hexdigest()[:16]
