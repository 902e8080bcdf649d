"""A minimal pure-Python reader for CUDA cubins (ELF64, little-endian).

The pack writer must not trust its own idea of a compiled kernel's parameter
buffer: Triton drops constexprs, appends hidden pointers and ptxas decides the
offsets.  The cubin itself records the truth, so the writer reads it back from
here.  Only what a launcher needs is decoded: the target SM, the kernel entry
symbols and each entry's parameter layout.  Every malformation raises
``ValueError`` naming the problem.

Formats below were read off Triton 3.6.0 cubins (ptxas of CUDA 12.8 for sm_80..
sm_90a, CUDA 12.9 ``ptxas-blackwell`` for sm_100a/sm_120a) and cross-checked with
``cuobjdump -elf``.  All integers are little-endian.

ELF header and SM arch
----------------------
``e_ident[0:4]`` is ``7f 'E' 'L' 'F'``, ``e_ident[EI_CLASS=4]`` is 2 (ELF64),
``e_ident[EI_DATA=5]`` is 1 (little-endian), ``e_machine`` (u16 at offset 18) is
190 (``EM_CUDA``).  ``e_flags`` (u32 at offset 48) encodes the SM in one of two
ways selected by ``e_ident[EI_ABIVERSION=8]``:

* ABI version 7 (sm_90a and older; ``e_ident[EI_OSABI=7]`` is 0x33):
  ``sm = e_flags & 0xff``; bit ``0x800`` is set for an arch-specific ``a``
  target (sm_90a); bit ``0x400`` is 64-bit addressing, ``0x100`` unified
  texture mode; ``(e_flags >> 16) & 0xff`` is the virtual (PTX) SM.
  Observed: sm_90a ``0x005a0d5a``, sm_90 ``0x005a055a``, sm_80 ``0x00500550``.
* ABI version 8 (sm_100 and newer; ``e_ident[EI_OSABI]`` is 0x41):
  ``sm = (e_flags >> 8) & 0xff``; bit ``0x8`` is the ``a`` suffix.
  Observed: sm_100a ``0x0900640a``, sm_100 ``0x09006402``, sm_120a ``0x0900780a``.

Kernel entries
--------------
Symbols of the ``SHT_SYMTAB`` section (24-byte ``Elf64_Sym``) with
``ST_TYPE(st_info) == STT_FUNC (2)`` and ``ST_BIND(st_info) == STB_GLOBAL (1)``,
in symbol-table order; names come from the string table in the symtab's
``sh_link``.

``.nv.info.<entry>`` records
----------------------------
The section is a packed sequence of records, each starting with a 4-byte
header ``u8 format, u8 attribute, u16 value``:

* ``EIFMT_NVAL`` (0x01), ``EIFMT_BVAL`` (0x02), ``EIFMT_HVAL`` (0x03): the
  record is just the header; ``value`` is the (possibly unused) immediate.
* ``EIFMT_SVAL`` (0x04): ``value`` is a payload size ``N``; ``N`` payload bytes
  follow the header directly (no padding).

``EIATTR_KPARAM_INFO`` is attribute 0x17 with format ``EIFMT_SVAL`` and a
12-byte payload, one record per kernel parameter (ptxas emits them in
descending ordinal order)::

    bytes 0..3   u32  index        always 0 in Triton cubins (ignored)
    bytes 4..5   u16  ordinal      parameter position, 0-based
    bytes 6..7   u16  offset       byte offset in the parameter buffer
    bytes 8..11  u32  flags:
        bits  0..7   log2 of the pointee alignment (0 in Triton cubins)
        bits  8..11  space (cuobjdump "Space": 4 for pointers, 0 for scalars)
        bits 12..16  constant bank (0x1f)
        bit  17      0 = passed in the constant bank ("Parameter Space: CBANK")
        bits 18..31  size in bytes  (= flags >> 18)

Example (``add_kernel``, ordinal 3, the ``i32`` ``n``): payload
``00 00 00 00  03 00  18 00  00 f0 11 00`` -> ordinal 3, offset 0x18, flags
0x0011f000 -> size 4.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Tuple

EM_CUDA = 190
SHT_SYMTAB = 2
SHT_NOBITS = 8
STT_FUNC = 2
STB_GLOBAL = 1

EIFMT_NVAL = 0x01
EIFMT_BVAL = 0x02
EIFMT_HVAL = 0x03
EIFMT_SVAL = 0x04
EIATTR_KPARAM_INFO = 0x17
KPARAM_INFO_PAYLOAD_SIZE = 12

_ELF_HEADER_SIZE = 64
_SECTION_HEADER_SIZE = 64
_SYMBOL_SIZE = 24


@dataclass(frozen=True)
class ParamSlot:
    """One parameter of a compiled kernel, as the cubin's KPARAM_INFO says."""

    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class Cubin:
    """What a launcher needs to know about a cubin.

    ``arch`` is the SM as ``major*10+minor`` (90 for sm_90a);
    ``arch_specific`` is True for an ``a`` target, which loads only on exactly
    that compute capability.  ``layouts`` maps every kernel entry symbol, in
    symbol-table order, to its parameter slots sorted by ordinal.
    """

    arch: int
    arch_specific: bool
    layouts: Mapping[str, Tuple[ParamSlot, ...]]

    @property
    def entries(self) -> Tuple[str, ...]:
        """The kernel entry symbols, in symbol-table order."""
        return tuple(self.layouts)


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def read_cubin(path) -> Cubin:
    """Parse the cubin file at ``path``."""
    return parse_cubin(Path(path).read_bytes())


def parse_cubin(data: bytes) -> Cubin:
    """Parse cubin bytes; raise ValueError naming the first problem found."""
    data = bytes(data)
    arch, arch_specific, shoff, shnum, shstrndx = _parse_header(data)
    sections = _parse_sections(data, shoff, shnum, shstrndx)
    layouts = {}
    for entry in _kernel_entries(data, sections):
        info = [s for s in sections if s.name == ".nv.info." + entry]
        if not info:
            raise ValueError(
                f"cubin: no section '.nv.info.{entry}' for kernel entry '{entry}'")
        layouts[entry] = _parse_kparams(data, info[0], entry)
    return Cubin(arch=arch, arch_specific=arch_specific, layouts=layouts)


def _bytes_at(data: bytes, offset: int, size: int, what: str) -> bytes:
    """Return data[offset:offset+size], refusing to read past the end."""
    if offset < 0 or size < 0 or offset + size > len(data):
        raise ValueError(
            f"cubin truncated: {what} at offset {offset} size {size} "
            f"exceeds file size {len(data)}")
    return data[offset:offset + size]


def _c_string(table: bytes, offset: int, what: str) -> str:
    """Read a NUL-terminated string from a string table."""
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise ValueError(f"cubin: {what} name offset {offset} is outside its string table")
    return table[offset:end].decode("utf-8", errors="replace")


def _parse_header(data: bytes):
    """Check the ELF identity and decode the SM from e_flags."""
    if len(data) < 4 or data[:4] != b"\x7fELF":
        raise ValueError("cubin: not an ELF file (bad magic)")
    header = _bytes_at(data, 0, _ELF_HEADER_SIZE, "ELF header")
    if header[4] != 2 or header[5] != 1:
        raise ValueError("cubin: not a 64-bit little-endian ELF file")
    abi_version = header[8]
    (machine,) = struct.unpack_from("<H", header, 18)
    if machine != EM_CUDA:
        raise ValueError(f"cubin: e_machine is {machine}, expected {EM_CUDA} (EM_CUDA)")
    phoff, shoff = struct.unpack_from("<QQ", header, 32)
    (flags,) = struct.unpack_from("<I", header, 48)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", header, 54)
    # Not otherwise needed, but ptxas puts this table last: checking its bounds
    # catches a file cut anywhere.
    _bytes_at(data, phoff, phnum * phentsize, "program header table")
    if abi_version == 7:
        arch, arch_specific = flags & 0xFF, bool(flags & 0x800)
    elif abi_version == 8:
        arch, arch_specific = (flags >> 8) & 0xFF, bool(flags & 0x8)
    else:
        raise ValueError(f"cubin: unsupported CUDA ELF ABI version {abi_version}")
    if shentsize != _SECTION_HEADER_SIZE:
        raise ValueError(f"cubin: section header size is {shentsize}, expected 64")
    if shnum == 0 or shstrndx >= shnum:
        raise ValueError(
            f"cubin: no usable section headers (e_shnum {shnum}, e_shstrndx {shstrndx})")
    return arch, arch_specific, shoff, shnum, shstrndx


def _parse_sections(data: bytes, shoff: int, shnum: int, shstrndx: int):
    """Read all section headers and resolve their names."""
    table = _bytes_at(data, shoff, shnum * _SECTION_HEADER_SIZE, "section header table")
    raw = []
    for i in range(shnum):
        name, stype, _flags, _addr, offset, size, link = struct.unpack_from(
            "<IIQQQQI", table, i * _SECTION_HEADER_SIZE)
        if stype != SHT_NOBITS:
            _bytes_at(data, offset, size, f"section {i}")
        raw.append((name, stype, offset, size, link))
    _, _, str_offset, str_size, _ = raw[shstrndx]
    names = data[str_offset:str_offset + str_size]
    return [_Section(_c_string(names, name, f"section {i}"), stype, offset, size, link)
            for i, (name, stype, offset, size, link) in enumerate(raw)]


def _kernel_entries(data: bytes, sections):
    """Names of the global STT_FUNC symbols, in symbol-table order."""
    symtabs = [s for s in sections if s.type == SHT_SYMTAB]
    if len(symtabs) != 1:
        raise ValueError(f"cubin: expected one symbol table, found {len(symtabs)}")
    symtab = symtabs[0]
    if symtab.size % _SYMBOL_SIZE or symtab.link >= len(sections):
        raise ValueError("cubin: malformed symbol table header")
    strtab = sections[symtab.link]
    strings = data[strtab.offset:strtab.offset + strtab.size]
    entries = []
    for i in range(symtab.size // _SYMBOL_SIZE):
        name, info = struct.unpack_from("<IB", data, symtab.offset + i * _SYMBOL_SIZE)
        if info & 0xF == STT_FUNC and info >> 4 == STB_GLOBAL:
            entries.append(_c_string(strings, name, f"symbol {i}"))
    if not entries:
        raise ValueError("cubin: no kernel entry (global STT_FUNC symbol)")
    return entries


def _parse_kparams(data: bytes, section: _Section, entry: str) -> Tuple[ParamSlot, ...]:
    """Decode the KPARAM_INFO records of one ``.nv.info.<entry>`` section."""
    body = data[section.offset:section.offset + section.size]
    where = f"cubin: section '{section.name}'"
    slots = []
    pos = 0
    while pos < len(body):
        if pos + 4 > len(body):
            raise ValueError(f"{where}: truncated record header at byte {pos}")
        fmt, attr, value = struct.unpack_from("<BBH", body, pos)
        pos += 4
        if fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            continue
        if fmt != EIFMT_SVAL:
            raise ValueError(f"{where}: unknown record format 0x{fmt:02x} at byte {pos - 4}")
        payload = body[pos:pos + value]
        if len(payload) != value:
            raise ValueError(
                f"{where}: record payload of {value} bytes at byte {pos} runs past the end")
        pos += value
        if attr != EIATTR_KPARAM_INFO:
            continue
        if value != KPARAM_INFO_PAYLOAD_SIZE:
            raise ValueError(
                f"{where}: KPARAM_INFO payload is {value} bytes, expected "
                f"{KPARAM_INFO_PAYLOAD_SIZE}")
        _index, ordinal, offset, flags = struct.unpack("<IHHI", payload)
        slots.append(ParamSlot(ordinal=ordinal, offset=offset, size=flags >> 18))
    slots.sort(key=lambda s: s.ordinal)
    if [s.ordinal for s in slots] != list(range(len(slots))):
        raise ValueError(
            f"{where}: KPARAM_INFO ordinals of '{entry}' are not 0..{len(slots) - 1}: "
            f"{[s.ordinal for s in slots]}")
    return tuple(slots)
