"""scripts/keep_cuda_arch.py on a small ELF library with a real fat-binary layout: only other SMs'
payloads become zeros, nothing moves, and the wheel's RECORD names the new file."""
import base64
import hashlib
import struct
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO
import keep_cuda_arch

ENTRY_HEADER_SIZE = 64


def fat_binary(entries: list[tuple[int, bytes]]) -> bytes:
    """A fat binary with one ELF entry per (sm, payload)."""
    body = b""
    for sm, payload in entries:
        header = bytearray(ENTRY_HEADER_SIZE)
        struct.pack_into("<HHIQ", header, 0, 2, 0x101, ENTRY_HEADER_SIZE, len(payload))
        struct.pack_into("<I", header, keep_cuda_arch.ENTRY_SM_OFFSET, sm)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", keep_cuda_arch.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_library(fatbin_section: bytes) -> bytes:
    """A 64-bit little-endian ELF file whose sections are: null, .text, .nv_fatbin, .shstrtab."""
    names = b"\0.text\0.nv_fatbin\0.shstrtab\0"
    text = b"\x90" * 32
    text_off = 64
    fat_off = text_off + len(text)
    names_off = fat_off + len(fatbin_section)
    shoff = names_off + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 4, 3)
    sections = [(0, 0, 0, 0), (names.index(b".text"), 1, text_off, len(text)),
                (names.index(b".nv_fatbin"), 1, fat_off, len(fatbin_section)),
                (names.index(b".shstrtab"), 3, names_off, len(names))]
    table = b"".join(struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, off, size, 0, 0, 1, 0)
                     for name, kind, off, size in sections)
    return bytes(header) + text + fatbin_section + names + table


SM80, SM90, SM100 = b"A" * 40, b"B" * 24, b"C" * 56


def library() -> bytes:
    # second fat binary has no sm_90 entry: it must be left whole; 8 bytes of padding between
    return elf_library(fat_binary([(80, SM80), (90, SM90), (100, SM100)]) + bytes(8)
                       + fat_binary([(80, SM80)]))


def test_other_sms_are_zeroed_in_place_and_sm90_kept():
    original = library()
    data = bytearray(original)
    counts = keep_cuda_arch.keep_sm(data, 90)
    assert len(data) == len(original)
    assert counts == {"kept": len(SM90), "zeroed": len(SM80) + len(SM100),
                      "whole": len(fat_binary([(80, SM80)]))}
    assert data.count(SM90) == 1 and data.count(SM100) == 0
    assert data.count(SM80) == 1           # the one in the fat binary without sm_90
    # everything outside the zeroed payloads is byte for byte the original
    changed = [i for i, (a, b) in enumerate(zip(original, data)) if a != b]
    assert len(changed) == len(SM80) + len(SM100)


def test_a_library_without_device_code_is_left_alone():
    data = bytearray(elf_library(b""))
    assert keep_cuda_arch.keep_sm(data, 90) == {"kept": 0, "zeroed": 0, "whole": 0}
    data = bytearray(b"not an ELF file")
    assert keep_cuda_arch.keep_sm(data, 90)["zeroed"] == 0


def test_unknown_entry_kind_is_an_error_not_a_guess():
    bad = bytearray(fat_binary([(90, SM90)]))
    struct.pack_into("<H", bad, 16, 7)          # first entry's kind
    with pytest.raises(ValueError, match="kind 7"):
        keep_cuda_arch.keep_sm(bytearray(elf_library(bytes(bad))), 90)


def test_wheel_is_rewritten_with_its_record(tmp_path):
    wheel = tmp_path / "in" / "demo-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    lib = library()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo/libdemo.so", lib)
        z.writestr("demo/__init__.py", "")
        z.writestr("demo-1.0.dist-info/RECORD",
                   "demo/libdemo.so,sha256=old,1\ndemo/__init__.py,,0\ndemo-1.0.dist-info/RECORD,,\n")
    result = subprocess.run([sys.executable, str(REPO / "scripts/keep_cuda_arch.py"), str(wheel),
                             str(tmp_path / "out")], capture_output=True, text=True, check=True)
    assert "sm_90 kept" in result.stdout
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as z:
        new_lib = z.read("demo/libdemo.so")
        record = z.read("demo-1.0.dist-info/RECORD").decode().splitlines()
    assert new_lib.count(SM100) == 0 and new_lib.count(SM90) == 1
    digest = base64.urlsafe_b64encode(hashlib.sha256(new_lib).digest()).rstrip(b"=").decode()
    assert record[0] == f"demo/libdemo.so,sha256={digest},{len(new_lib)}"
    assert record[1:] == ["demo/__init__.py,,0", "demo-1.0.dist-info/RECORD,,"]


def test_missing_wheel_is_named():
    result = subprocess.run([sys.executable, str(REPO / "scripts/keep_cuda_arch.py"), "nope.whl", "out"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "nope.whl is not a file" in result.stderr
