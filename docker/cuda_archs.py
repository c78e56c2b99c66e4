#!/usr/bin/env python3
"""Which GPU architectures a CUDA shared object carries, read from its ELF `.nv_fatbin` section (what
`cuobjdump --list-elf/--list-ptx` lists), with no CUDA toolkit. Used by the GPU image's build checks
and by `make gpu-closure-check` on the downloaded wheels.

    cuda_archs.py check-wheels DIR      torch, sglang-kernel and flashinfer wheels in DIR carry sm_120
    cuda_archs.py check-installed       the same for the installed packages (inside the GPU image)
    cuda_archs.py list FILE.so ...      print each file's architectures

A fatbin is a sequence of containers (magic 0xBA55ED50, u16 version, u16 header size, u64 payload
size); each payload is a sequence of entries (u16 kind: 1 PTX, 2 ELF/SASS; u16; u32 entry header
size; u64 data size; u32; u32; u16 minor; u16 major; u32 arch, e.g. 120 for sm_120)."""

from __future__ import annotations

import re
import shutil
import struct
import sys
import tempfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "sass"}


def elf_section(data: bytes, name: str) -> bytes | None:
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only
        return None
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if e_shoff == 0 or e_shnum == 0:
        return None
    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
    strtab = sh(e_shstrndx)
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for i in range(e_shnum):
        s = sh(i)
        end = names.find(b"\0", s[0])
        if names[s[0]:end].decode(errors="replace") == name and s[1] != 8:  # not SHT_NOBITS
            return data[s[4]:s[4] + s[5]]
    return None


def fatbin_archs(blob: bytes) -> set[str]:
    """Architectures in a fatbin blob: {'sm_120', 'sm_90a', 'compute_120' (PTX), ...}."""
    out: set[str] = set()
    pos = 0
    while pos + 16 <= len(blob):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, pos)
        if magic != FATBIN_MAGIC:
            nxt = blob.find(struct.pack("<I", FATBIN_MAGIC), pos + 1)
            if nxt < 0:
                break
            pos = nxt
            continue
        e, end = pos + hsize, pos + hsize + fsize
        while e + 40 <= min(end, len(blob)):
            kind, _u, ehsize, dsize = struct.unpack_from("<HHIQ", blob, e)
            arch, = struct.unpack_from("<I", blob, e + 28)
            if ehsize == 0:
                break
            if kind in KINDS and 10 <= arch < 1000:
                out.add(("sm_" if kind == 2 else "compute_") + str(arch))
            e += ehsize + dsize
        pos = end
    return out


def file_archs(path: Path) -> set[str]:
    data = path.read_bytes()
    sec = elf_section(data, ".nv_fatbin")
    found = fatbin_archs(sec) if sec else set()
    if not found and data[:4] == b"\x7fELF":
        # some libraries keep the fatbin in .rodata / other sections: scan for the magic
        found = fatbin_archs(data) if struct.pack("<I", FATBIN_MAGIC) in data else set()
    return found


def has_sm120(archs: set[str]) -> bool:
    """SASS for sm_120 (the header's arch number also covers sm_120a/f) or compute_120 PTX; PTX of an
    older architecture would JIT as well, but does not count: the images promise SM120 kernels."""
    return "sm_120" in archs or "compute_120" in archs


# distribution name prefix -> the libraries that must carry SM120 code (every .so of sglang-kernel is
# listed; its FA3 and FlashMLA libraries are Hopper / datacenter-Blackwell only, by design).
REQUIRED = {"torch": r"libtorch_cuda\.so$", "sglang_kernel": r"common_ops[^/]*\.so$", "flashinfer": r"\.so$"}
# flashinfer-python 0.7.2 ships no compiled kernels: it JIT-compiles them with the closure's nvcc
# (nvidia-cuda-nvcc), so there the check is that this nvcc can target sm_120 (CUDA >= 12.8).
JIT_NVCC = re.compile(r"nvidia_cuda_nvcc(?:_cu\d+)?-(\d+)\.(\d+)")


def check_libs(libs: dict[str, list[tuple[str, set[str]]]], nvcc: tuple[int, int] | None = None) -> list[str]:
    errors = []
    for dist, pattern in REQUIRED.items():
        got = libs.get(dist, [])
        for n, a in got:
            print(f"  {dist}: {n}: {'sm_120' if has_sm120(a) else 'no sm_120'} {sorted(a)}")
        if dist == "flashinfer" and not got:
            ok = nvcc is not None and nvcc >= (12, 8)
            print(f"  flashinfer: no compiled kernels (JIT); nvcc in the closure: {nvcc} -> "
                  f"{'targets sm_120' if ok else 'cannot target sm_120'}")
            if not ok:
                errors.append(f"flashinfer: JIT-only and the closure's nvcc {nvcc} cannot target sm_120 (needs >= 12.8)")
            continue
        must = [(n, a) for n, a in got if re.search(pattern, n)]
        if not must:
            errors.append(f"{dist}: no shared object matching {pattern}")
        for n, a in must:
            if not has_sm120(a):
                errors.append(f"{dist}: {n} has no sm_120 code; architectures {sorted(a)}")
    return errors


def wheel_libs(wheel_dir: Path) -> dict[str, list[tuple[str, set[str]]]]:
    libs: dict[str, list[tuple[str, set[str]]]] = {}
    tmp = Path(tempfile.mkdtemp())
    try:
        for whl in sorted(wheel_dir.glob("*.whl")):
            dist = next((d for d in REQUIRED if whl.name.lower().startswith(d)), None)
            if dist is None:
                continue
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    if not (re.search(REQUIRED[dist], info.filename) or (
                            dist != "torch" and re.search(r"\.so(\.\d+)*$", info.filename))):
                        continue
                    out = tmp / "lib.so"
                    with z.open(info) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 24)
                    libs.setdefault(dist, []).append((f"{whl.name}:{info.filename}", file_archs(out)))
                    out.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return libs


def installed_libs() -> dict[str, list[tuple[str, set[str]]]]:
    import importlib.util
    libs: dict[str, list[tuple[str, set[str]]]] = {}
    for dist, mod in (("torch", "torch"), ("sglang_kernel", "sgl_kernel"), ("flashinfer", "flashinfer")):
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            for so in Path(root).rglob("*.so*"):
                if dist == "torch" and not re.search(REQUIRED["torch"], so.name):
                    continue
                libs.setdefault(dist, []).append((str(so), file_archs(so)))
    return libs


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "list":
        for f in argv[1:]:
            print(f, sorted(file_archs(Path(f))))
        return 0
    if argv[:1] == ["check-wheels"] and len(argv) == 2:
        m = next((JIT_NVCC.match(w.name) for w in Path(argv[1]).glob("nvidia_cuda_nvcc*.whl")), None)
        errors = check_libs(wheel_libs(Path(argv[1])), (int(m[1]), int(m[2])) if m else None)
    elif argv == ["check-installed"]:
        from importlib import metadata
        try:
            v = metadata.version("nvidia-cuda-nvcc")
        except metadata.PackageNotFoundError:
            v = None
        errors = check_libs(installed_libs(), tuple(int(x) for x in v.split(".")[:2]) if v else None)
    else:
        print(__doc__)
        return 2
    for e in errors:
        print("SM120 check FAILED:", e)
    if not errors:
        print("SM120 check: torch and sglang-kernel carry sm_120 code, flashinfer's JIT nvcc targets sm_120")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
