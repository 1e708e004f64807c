"""The GPU slot allocator, with real concurrent processes and real file locks (no GPU needed)."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from longca.execution.processes import gpu_slots

HOLD_S = 0.4


def _hold(lock_dir, devices, log_path, ready):
    ready.wait(60)  # every process imported and started: they ask for a slot together
    with gpu_slots.acquire(devices, lock_dir=lock_dir, timeout_s=30) as slot:
        start = time.monotonic()
        time.sleep(HOLD_S)
        end = time.monotonic()
    with open(log_path, "a") as f:
        f.write(json.dumps([slot.device, start, end]) + "\n")


def test_concurrent_cells_never_share_a_device_and_use_them_all(tmp_path):
    ctx = mp.get_context("spawn")  # fresh interpreters, like separate Snakemake jobs
    log = tmp_path / "log"
    ready = ctx.Barrier(6)
    procs = [ctx.Process(target=_hold, args=(tmp_path / "locks", ["0", "1"], log, ready)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(spans) == 6 and {d for d, _, _ in spans} == {"0", "1"}
    for device in ("0", "1"):
        mine = sorted((s, e) for d, s, e in spans if d == device)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(mine, mine[1:])), f"device {device} shared"
    # Both devices in use at once: some hold on one overlaps some hold on the other.  (Not a wall-time
    # bound: a loaded machine can stretch the rounds, but it cannot make the holds overlap.)
    on = {device: [(s, e) for d, s, e in spans if d == device] for device in ("0", "1")}
    assert any(s0 < e1 and s1 < e0 for s0, e0 in on["0"] for s1, e1 in on["1"])


def test_a_killed_holder_frees_its_slot(tmp_path):
    code = ("import sys, time; from longca.execution.processes import gpu_slots; "
            f"s = gpu_slots.acquire(['7'], lock_dir={str(tmp_path)!r}); print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(TimeoutError):
        gpu_slots.acquire(["7"], lock_dir=tmp_path, timeout_s=0.3)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with gpu_slots.acquire(["7"], lock_dir=tmp_path, timeout_s=5) as slot:
        assert slot.device == "7"


def test_visible_devices_follow_cuda_visible_devices():
    env = {"CUDA_VISIBLE_DEVICES": "2, 3,5"}
    assert gpu_slots.visible_devices(environ=env) == ["2", "3", "5"]
    assert gpu_slots.visible_devices(2, environ=env) == ["2", "3"]
    assert gpu_slots.visible_devices(environ={"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError, match="no GPU"):
        gpu_slots.acquire([])


def test_acquire_set_takes_a_whole_free_group_so_two_pairs_share_four_gpus(tmp_path):
    from longca.execution.processes.gpu_slots import acquire_set

    devices = ["0", "1", "2", "3"]
    first = acquire_set(devices, 2, lock_dir=tmp_path)
    second = acquire_set(devices, 2, lock_dir=tmp_path)
    assert sorted(s.device for s in first + second) == devices
    assert {s.device for s in first} in ({"0", "1"}, {"2", "3"})
    for slot in first:
        slot.release()
    third = acquire_set(devices, 2, lock_dir=tmp_path)  # the freed pair, not half of each
    assert {s.device for s in third} == {s.device for s in first}
    with pytest.raises(ValueError, match="3 GPUs asked for, 2 visible"):
        acquire_set(["0", "1"], 3, lock_dir=tmp_path)
