"""Shrink a prebuilt CUDA wheel to one GPU architecture for copying: every shared library's device
code for other architectures is zeroed in place, so the wheel compresses to what one GPU needs.

    python scripts/keep_cuda_arch.py IN.whl OUT_DIR [--sm 90]

Why: TransformerEngine's core wheel ships SASS for sm_75 ... sm_120 (263 MB of device code, 17 MB
of it sm_90) and compresses poorly; an H100/H200 loads only the sm_90 cubins.  Building the core
from source for sm_90 alone is the clean way but takes hours on a small machine.

How: a library's `.nv_fatbin` section holds fat binaries (header magic 0xBA55ED50), each a list of
entries (PTX or ELF cubin) tagged with the SM they were built for.  Entries for other SMs keep
their headers and sizes but get zero payloads: no offset in the library moves, and the CUDA driver
never reads an entry it does not select (cubins run only on their own major architecture).  A fat
binary with no entry for the kept SM is left whole.  The wheel's RECORD gets the new hashes.
The output wheel has the same name, so pip installs it as the original.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import struct
import sys
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")        # magic, version, header size, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQ")         # kind (1 PTX, 2 ELF), version, header size, payload size
ENTRY_SM_OFFSET = 28                          # uint32 SM (e.g. 90) inside an entry header
KINDS = {1: "ptx", 2: "elf"}


def elf_section(data: bytes | bytearray, name: str) -> tuple[int, int] | None:
    """(file offset, size) of the 64-bit little-endian ELF section `name`, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]
    for sh_name, _type, _flags, _addr, offset, size, *_ in headers:
        end = data.index(b"\0", strtab_off + sh_name)
        if data[strtab_off + sh_name:end].decode() == name:
            return offset, size
    return None


def keep_sm(data: bytearray, sm: int) -> dict[str, int]:
    """Zero, in place, the payloads of fat-binary entries built for an SM other than `sm`.
    Returns byte counts: kept, zeroed, and whole (fat binaries with no `sm` entry, left as they are)."""
    counts = {"kept": 0, "zeroed": 0, "whole": 0}
    section = elf_section(data, ".nv_fatbin")
    if section is None:
        return counts
    start, size = section
    pos, end_of_section = start, start + size
    while pos + FATBIN_HEADER.size <= end_of_section:
        magic, _version, header_size, entries_size = FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:      # alignment padding between fat binaries
            pos += 8
            continue
        entries, fat_end = [], pos + header_size + entries_size
        entry = pos + header_size
        while entry < fat_end:
            kind, _v, entry_header_size, payload_size = ENTRY_HEADER.unpack_from(data, entry)
            entry_sm, = struct.unpack_from("<I", data, entry + ENTRY_SM_OFFSET)
            if kind not in KINDS:
                raise ValueError(f"fat binary at {pos:#x}: entry kind {kind} is neither PTX nor ELF")
            entries.append((entry + entry_header_size, payload_size, entry_sm))
            entry += entry_header_size + payload_size
        if not any(entry_sm == sm for _, _, entry_sm in entries):
            counts["whole"] += fat_end - pos
        else:
            for payload, payload_size, entry_sm in entries:
                if entry_sm == sm:
                    counts["kept"] += payload_size
                else:
                    data[payload:payload + payload_size] = bytes(payload_size)
                    counts["zeroed"] += payload_size
        pos = fat_end
    return counts


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def shrink_wheel(wheel: Path, out_dir: Path, sm: int) -> Path:
    out = out_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise SystemExit(f"OUT_DIR must differ from the wheel's folder ({wheel.parent})")
    new_files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zin:
        for info in zin.infolist():
            if ".so" not in Path(info.filename).name:
                continue
            data = bytearray(zin.read(info))
            counts = keep_sm(data, sm)
            if counts["zeroed"]:
                new_files[info.filename] = bytes(data)
                mib = {k: round(v / 2**20, 1) for k, v in counts.items()}
                print(f"{info.filename}: sm_{sm} kept {mib['kept']} MiB, other SMs zeroed "
                      f"{mib['zeroed']} MiB, fat binaries without sm_{sm} left whole {mib['whole']} MiB")
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        record = []
        for line in zin.read(record_name).decode().splitlines():
            name = line.split(",", 1)[0]
            if name in new_files:
                line = f"{name},{record_hash(new_files[name])},{len(new_files[name])}"
            record.append(line)
        out_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if info.filename == record_name:
                    data = ("\n".join(record) + "\n").encode()
                else:
                    data = new_files.get(info.filename) or zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    print(f"{out}: {out.stat().st_size / 1e6:.0f} MB (was {wheel.stat().st_size / 1e6:.0f} MB)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the wheel to shrink")
    parser.add_argument("out_dir", type=Path, help="folder for the shrunk wheel (same file name)")
    parser.add_argument("--sm", type=int, default=90, help="the SM whose device code is kept (default 90)")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        parser.error(f"wheel: {args.wheel} is not a file")
    shrink_wheel(args.wheel, args.out_dir, args.sm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
