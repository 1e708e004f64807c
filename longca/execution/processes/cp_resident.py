"""A resident CP group: one ``torchrun`` job that measures CP cell after cell on the same ranks.

Started by ``longca cp-group`` (``longca.execution.cluster.cp_group``), never by hand.  Every rank starts
Python, CUDA and the process group once; rank 0 serves a Unix socket, takes one cell at a time,
tells the other ranks over a gloo control group which cell comes next (or that the group ends),
and every rank runs ``cp_cell.run_cell`` as a fresh ``torchrun`` job's rank would.  The client
gets the group's process group id as soon as it is accepted (to kill the whole job on a timeout),
then the row.

The group ends after ``idle`` seconds without a cell, and after any row that may have left the
process group unusable (``timeout``, ``error``): the next cell then starts a fresh one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ... import cp_env
from ..measure.cp_cell import CPSpec, run_cell
from ..measure.cp_rank import identified, launch_seen
from ..measure.first_failure import Recorder
from .wire import recv_msg, send_msg

# Rows after which the group is not trusted with another cell.
ENDS_GROUP = frozenset({"timeout", "error"})


def _next_cell(ctrl, server: socket.socket | None, idle_s: float):
    """On rank 0: the next (connection, message), or (None, None) after ``idle_s``.  Every rank
    returns the message rank 0 broadcast (None: the group ends)."""
    conn, msg = None, None
    if server is not None:
        server.settimeout(idle_s)
        try:
            conn, _ = server.accept()
            conn.settimeout(None)
            # First the group's process group: a client whose cell then hangs (here or in any rank)
            # can kill the whole group.
            send_msg(conn, {"pgid": os.getpgrp()})
            msg, _ = recv_msg(conn)
        except (TimeoutError, socket.timeout):
            conn, msg = None, None
        except (ConnectionError, OSError):  # a client that hung up before its cell began
            conn, msg = None, {"skip": True}
    box = [msg]
    dist.broadcast_object_list(box, src=0, group=ctrl)
    return conn, box[0]


def serve(socket_path: str, device_type: str, idle_s: float, timeout_s: float, threads: int) -> int:
    backend = "nccl" if device_type == "cuda" else "gloo"
    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    # Cells are announced over gloo, whose wait for the next one may last the whole idle time.
    ctrl = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=idle_s + timeout_s + 60))
    rank = dist.get_rank()
    server = None
    if rank == 0:
        Path(socket_path).unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(socket_path)
        server.listen(64)
        print(f"longca cp-group {os.getpgrp()}: {dist.get_world_size()} ranks ({backend}) serving {socket_path} "
              f"(idle exit after {idle_s:g} s)", flush=True)
    served = 0
    try:
        # The group's environment is fixed for its life (its client starts one group per preset).
        seen = launch_seen()
        while True:
            conn, msg = _next_cell(ctrl, server, idle_s)
            if msg is None:
                break
            if msg.get("skip"):
                continue
            settings, launch = cp_env.split(msg["settings"])
            spec = CPSpec.from_dict(settings)
            started = time.time()
            # Each rank records its own first failure, so the row can name the earliest over all ranks.
            row = run_cell(spec, on_failure=Recorder(msg.get("failures"), rank).note)
            served += 1
            if rank == 0:
                identified(cp_env.record(row, launch, seen), msg.get("cell_id"), msg.get("fingerprint"))
                row["group_cell"] = served  # 1: this cell paid for the group's start-up
                try:
                    send_msg(conn, row)
                except OSError:  # the client was killed meanwhile: nobody to answer
                    pass
                finally:
                    conn.close()
                print(f"{msg.get('cell_id')}: {row['status']} in {time.time() - started:.1f} s", flush=True)
            status = [row["status"] if rank == 0 else None]
            dist.broadcast_object_list(status, src=0, group=ctrl)
            if status[0] in ENDS_GROUP:
                break
    finally:
        if server is not None:
            server.close()
            Path(socket_path).unlink(missing_ok=True)
        dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longca.execution.processes.cp_resident")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--idle", type=float, required=True, help="exit after this many seconds without a cell")
    parser.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank")
    args = parser.parse_args(argv)
    return serve(args.socket, args.device, args.idle, args.timeout, args.threads)


if __name__ == "__main__":
    sys.exit(main())
