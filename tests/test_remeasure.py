"""`longca remeasure`: a cell's row, its kept copy and its stored parts set aside, not deleted, so the
next run measures those parts again and takes the others from the store."""

import json
import subprocess
import sys

import pytest

from longca import run_dir
from longca.execution.cache import kept_rows
from longca.execution.cache.parts import part_key, part_settings
from longca.execution.cache.remeasure import set_aside
from longca.execution.cache.store import Store

SETTINGS = {"kernel": "sdpa", "kernel_options": {}, "mask": "causal", "seqlen": 64, "direction": "fwd",
            "dtype": "float32", "batch": 1, "heads_q": 2, "heads_kv": 2, "head_dim": 16, "mask_params": {},
            "seed": 0, "device": "cpu", "pattern": "causal", "gate_seqlen": 64, "warmup": 1, "reps": 2,
            "warmup_ms": 0.0, "warmup_max_ms": 0.0, "rep_ms": 0.0, "cuda_graph": False}


def _cell(root, seqlen):
    """A finished cell as a run leaves it: its row (mappings as JSON text), kept copy and three parts."""
    settings = {**SETTINGS, "seqlen": seqlen}
    row = {**settings, "kind": "kernel", "status": "ok", "kernel_options": "{}", "mask_params": "{}"}
    path = root / run_dir.KERNEL_CELLS / "sdpa" / "causal" / f"float32_fwd_{seqlen}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row))
    kept = root / kept_rows.KEPT / path.relative_to(root / run_dir.CELLS)
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"row": row}))
    store = Store(root / run_dir.STORE)
    for part in ("gate", "time", "memory"):
        store.put(part, part_key(part, settings, "code"), {"part": part}, part_settings(part, settings), "code")
    return path, {part: store.path(part, part_key(part, settings, "code")) for part in ("gate", "time", "memory")}


def test_the_rows_kept_copy_and_chosen_parts_are_moved_aside_and_nothing_else(tmp_path):
    row, parts = _cell(tmp_path, 64)
    other_row, other_parts = _cell(tmp_path, 128)
    folder, moved = set_aside([row.relative_to(tmp_path)], root=tmp_path)
    assert folder.parent == tmp_path / run_dir.REPLACED and len(moved) == 4
    assert not row.exists() and not parts["time"].exists() and not parts["memory"].exists()
    assert parts["gate"].exists()  # not asked: the next run takes it from the store
    assert other_row.exists() and all(p.exists() for p in other_parts.values())
    for path in (row, parts["time"], parts["memory"]):  # kept, under the same relative path
        assert (folder / path.relative_to(tmp_path / run_dir.ROOT)).exists()


def test_an_unreadable_row_is_moved_alone_and_bad_names_are_refused(tmp_path):
    row, parts = _cell(tmp_path, 64)
    row.write_text("{trunc")
    _, moved = set_aside([row], parts=("gate", "time", "memory"), root=tmp_path)
    assert len(moved) == 2 and all(p.exists() for p in parts.values())  # the row and its kept copy
    with pytest.raises(ValueError, match="no such row file"):
        set_aside([row], root=tmp_path)
    with pytest.raises(ValueError, match="not a cell's row file"):
        set_aside([tmp_path / "elsewhere.json"], root=tmp_path)
    with pytest.raises(ValueError, match="unknown part"):
        set_aside([row], parts=("speed",), root=tmp_path)


def test_the_command_says_what_it_set_aside(tmp_path):
    row, _ = _cell(tmp_path, 64)
    out = subprocess.run([sys.executable, "-m", "longca", "remeasure", str(row.relative_to(tmp_path)), "-d",
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "set aside 4 files under" in out.stdout and "measures 1 cell(s) again" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "longca", "remeasure", "nope.json", "-d", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "longca remeasure: nope.json: not a cell's row file" in bad.stderr
