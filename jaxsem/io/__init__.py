"""Files: VTU output for ParaView, checkpoints of named arrays, and files written atomically.

* :mod:`jaxsem.io.vtu` — element-local (E-vector) fields on the GLL nodes as ``.vtu`` files (and
  a ``.pvtu`` index of a distributed run's parts).
* :mod:`jaxsem.io.checkpoint` — checkpoints: named arrays, time, step and the run's metadata;
  read by name, every field checked.
* :mod:`jaxsem.io.atomic` — every file above is written through :func:`atomic_output` (a reader
  never sees half a file; a symlink at the destination is refused), and output paths are
  checked before a long run (:func:`check_writable`).
"""

from . import atomic as atomic, checkpoint as checkpoint, vtu as vtu
from .atomic import atomic_output as atomic_output, check_writable as check_writable
from .checkpoint import (Checkpoint as Checkpoint, checkpoint_meta as checkpoint_meta,
                         checkpoint_shapes as checkpoint_shapes, load_checkpoint as load_checkpoint,
                         meta_mismatch as meta_mismatch, save_checkpoint as save_checkpoint,
                         tree_fields as tree_fields, tree_from_fields as tree_from_fields)
from .vtu import rank_path as rank_path, vtu_cells as vtu_cells, vtu_points as vtu_points, write_vtu as write_vtu

__all__ = ["write_vtu", "rank_path", "vtu_cells", "vtu_points",
           "save_checkpoint", "load_checkpoint", "Checkpoint", "checkpoint_meta", "checkpoint_shapes",
           "meta_mismatch", "tree_fields", "tree_from_fields",
           "atomic_output", "check_writable"]
