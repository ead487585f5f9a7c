#!/usr/bin/env python3
"""Shrinks a libnccl.so.2 for one GPU architecture so it fits the device machine's carry
limit (64 MiB): every CUDA fatbin entry in the ELF's `.nv_fatbin` and `__nv_relfatbin`
sections whose architecture is not the one kept has its payload overwritten with zeros,
in place (same size, same offsets: the ELF stays valid and the host code is untouched).
Zeros compress to almost nothing, so `zstd --long` of the result is small. The driver
picks the entry of the device's own architecture, which is kept byte for byte.

Layout (NVIDIA's fatbin container as cuobjdump reads it; public descriptions, e.g.
the `fatbinary_section.h` structures shipped with the CUDA toolkit):
  container header: u32 magic 0xBA55ED50, u16 version, u16 header size, u64 body size;
  then entries: u16 kind (1 PTX, 2 ELF), u16 version, u32 header size, u64 payload size,
  u32 compressed size, u32 _, u16 minor, u16 major, u32 arch (e.g. 90 for sm_90), ...
  and the payload follows the entry header.

Usage: nccl-slim.py IN OUT [ARCH]   (ARCH defaults to 90: H100 and H200). Prints what it
kept and zeroed; exits 2 on a file that is not a 64-bit ELF with these sections.
"""

import struct
import sys

MAGIC = 0xBA55ED50


def sections(data):
    """The (name, offset, size) of every ELF64 section."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = []
    for name, _type, _flags, _addr, off, size in heads:
        end = data.index(b"\0", strtab + name)
        out.append((data[strtab + name:end].decode(), off, size))
    return out


def slim_section(data, start, size, keep, stats):
    """Walks the fatbin containers inside one section, zeroing foreign payloads."""
    pos, end = start, start + size
    while pos + 16 <= end:
        magic, _ver, hsize, body = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:
            pos += 8  # containers are 8-aligned; skip padding between them
            continue
        entry, body_end = pos + hsize, pos + hsize + body
        while entry + 32 <= body_end:
            kind, _v, ehsize, psize = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if ehsize == 0:
                break
            payload = entry + ehsize
            if arch == keep:
                stats["kept"] += psize
            else:
                data[payload:payload + psize] = bytes(psize)
                stats["zeroed"] += psize
            stats["entries"] += 1
            stats["kinds"][(kind, arch)] = stats["kinds"].get((kind, arch), 0) + 1
            entry = payload + psize
        pos = body_end


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    keep = int(sys.argv[3]) if len(sys.argv) > 3 else 90
    data = bytearray(open(src, "rb").read())
    try:
        found = [s for s in sections(data) if s[0] in (".nv_fatbin", "__nv_relfatbin")]
    except (ValueError, struct.error) as e:
        print(f"nccl-slim: {src}: {e}", file=sys.stderr)
        return 2
    if not found:
        print(f"nccl-slim: {src}: no .nv_fatbin or __nv_relfatbin section", file=sys.stderr)
        return 2
    stats = {"kept": 0, "zeroed": 0, "entries": 0, "kinds": {}}
    for _name, off, size in found:
        slim_section(data, off, size, keep, stats)
    with open(dst, "wb") as out:
        out.write(data)
    kinds = ", ".join(f"kind {k} arch {a}: {n}" for (k, a), n in sorted(stats["kinds"].items()))
    print(f"nccl-slim: {stats['entries']} entries ({kinds}); kept {stats['kept']} B of "
          f"arch {keep}, zeroed {stats['zeroed']} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
