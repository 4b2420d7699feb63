"""Lets ``init_process_group('cgx')`` work under mpirun / PMI launchers with no shim.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Under Open MPI
(``OMPI_COMM_WORLD_*``) or a PMI launcher (``PMI_RANK`` / ``PMI_SIZE``, MPICH, Intel MPI, Slurm's
PMI) the torch variables are absent: :func:`apply_launcher_env` fills them in from the launcher's
(MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to 29500 for single-host runs; set them for
multi-host runs). Variables already set are never overwritten.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

_LAUNCHERS = (
    # (rank, world size, local rank, local world size)
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
)


def apply_launcher_env(env: Optional[MutableMapping[str, str]] = None) -> bool:
    """Maps an MPI/PMI launcher's variables to torch's; returns whether it did."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return False
    for rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        if rank_var in env and size_var in env:
            env.setdefault("RANK", env[rank_var])
            env.setdefault("WORLD_SIZE", env[size_var])
            env.setdefault("LOCAL_RANK", env.get(local_var, env[rank_var]))
            if local_size_var in env:
                env.setdefault("LOCAL_WORLD_SIZE", env[local_size_var])
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", "29500")
            return True
    return False
