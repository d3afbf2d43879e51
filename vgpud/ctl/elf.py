"""The exported function names of a shared library, read from its ELF
dynamic symbol table (no external tools): what `nm -D --defined-only`
would list as T/W."""

from __future__ import annotations

import struct
from pathlib import Path

SHT_DYNSYM = 11
STT_FUNC = 2
STB_GLOBAL = 1
STB_WEAK = 2
SHN_UNDEF = 0


class ElfError(Exception):
    pass


def exported_functions(path: Path) -> set[str]:
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path} is not an ELF file")
    if data[4] != 2:
        raise ElfError(f"{path} is not a 64-bit ELF file")
    endian = "<" if data[5] == 1 else ">"
    (shoff,) = struct.unpack_from(endian + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
    sections = [_section(data, endian, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for sh_type, offset, size, link, entsize in sections:
        if sh_type != SHT_DYNSYM or entsize == 0:
            continue
        _, str_off, str_size, _, _ = sections[link]
        strtab = data[str_off : str_off + str_size]
        for i in range(1, size // entsize):  # entry 0 is the null symbol
            name_off, info, _, shndx = struct.unpack_from(
                endian + "IBBH", data, offset + i * entsize
            )
            bind, kind = info >> 4, info & 0xF
            if shndx != SHN_UNDEF and kind == STT_FUNC and bind in (STB_GLOBAL, STB_WEAK):
                end = strtab.index(b"\0", name_off)
                names.add(strtab[name_off:end].decode())
    return names


def _section(data: bytes, endian: str, at: int) -> tuple[int, int, int, int, int]:
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    _, sh_type, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
        endian + "IIQQQQIIQQ", data, at
    )
    return sh_type, offset, size, link, entsize
