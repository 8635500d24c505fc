"""The masked runtime: a copy of this interpreter's onnxruntime and numpy whose `cpuid` instructions trap.

Every shared object of the copied packages (onnxruntime, numpy, numpy.libs) is searched for the bytes 0F A2 and
disassembled with objdump from the entry of each function holding them (cpuid_addresses; the whole file where
it has no unwind table); each `cpuid` objdump finds (0F A2, at a true instruction boundary) is located in the file
through the ELF program headers (virtual address -> file offset of its PT_LOAD segment), checked to hold 0F A2,
and overwritten with `ud2` (0F 0B). The C shim (cpuid_shim.c, LD_PRELOADed into the worker) turns the
SIGILL of each one into the profile's CPUID. The copy lives under QUANTBENCH_HOME:

  masked/<ort-version>-<key>/site/     onnxruntime/, numpy/, numpy.libs/ (patched)
  masked/<ort-version>-<key>/cpuid-sites.tsv  every patched site (path, file offset): the shim's list
  masked/<ort-version>-<key>.json      its stamp: every patched file with its sites and SHA-256
  masked/shim-<key>.so                 the compiled shim
  masked/<ort-version>-<key>/.site.lock, masked/.shim-<key>.so.lock   their build locks (fsutil.build_once:
                                       one builder, in a temporary of its own; other hosts and commands wait)

<key> hashes what the copy is made from (each source file's path, size and mtime, and this module's
source), so another onnxruntime or numpy install gets another copy; a rebuild is idempotent. A build removes
the copies whose source packages are gone (prune_orphans).

A process works the key out and checks the copy once (`_ONCE`): a command starts several masked workers
(and asks for the fingerprint key of each), and stat-ing ~2,000 package files and hashing ~100 MB of
libraries each time cost ~0.5 s per masked host of a run. Its packages do not change under it.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import hashlib
import importlib.machinery
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError
from quantbench.fsutil import atomic_write_json, atomic_write_text, build_once, file_state
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.runtimes import read_stamp, stamp_of

PACKAGES = ("onnxruntime", "numpy", "numpy.libs")
SHIM_SOURCE = Path(__file__).with_name("cpuid_shim.c")
CPUID, UD2 = b"\x0f\xa2", b"\x0f\x0b"
MAX_INSN = 15   # bytes of the longest x86 instruction
#: windows closer than this are one (an objdump start reads the file's symbols: ~0.05 s, the time it decodes
#: ~128 KiB of code in); decoding on from a function's entry across the next is what a linear sweep does
MERGE_GAP = 128 * 1024
#: one objdump line of a cpuid instruction, matched where the word cpuid was found (the whole listing is 250 MB for
#: onnxruntime's library: a search for the word and then its line took 0.3 s, a regex over every line 5 s)
_CPUID_LINE = re.compile(rb"[ \t]*([0-9a-f]+):[ \t]+cpuid\b")


def _package_dirs() -> list[Path]:
    """The folders of PACKAGES in this interpreter's site-packages (numpy.libs may be absent)."""
    out = []
    # under a whole-process mask (`hosts exec`) a masked copy is first on sys.path: copy the originals, also when
    # that copy lives in another QUANTBENCH_HOME (QUANTBENCH_CPUID_ROOT: the site of the mask this process runs under)
    roots = [masked_root()] + ([Path(os.environ["QUANTBENCH_CPUID_ROOT"])] if os.environ.get("QUANTBENCH_CPUID_ROOT")
                               else [])
    masked = tuple(os.path.realpath(r) + os.sep for r in roots)
    path = [p for p in sys.path if not (os.path.realpath(p or ".") + os.sep).startswith(masked)]
    for name in ("onnxruntime", "numpy"):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"masked hosts: this interpreter ({sys.executable}) has no {name} to copy")
        out.append(Path(list(spec.submodule_search_locations)[0]))
    libs = out[1].parent / "numpy.libs"
    return out + ([libs] if libs.is_dir() else [])


def _source_files(dirs: list[Path]):
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield d, path


#: this process's content keys (by package folders) and the copies it checked (by key): see the docstring
_ONCE: dict = {}


def content_key() -> str:
    """What the masked copy is made from: every source file (path, size, mtime) and the patcher."""
    dirs = tuple(_package_dirs())
    if ("key", dirs) not in _ONCE:
        h = hashlib.sha256(Path(__file__).read_bytes())
        for d, path in _source_files(dirs):
            st = path.stat()
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        _ONCE["key", dirs] = h.hexdigest()[:16]
    return _ONCE["key", dirs]


def masked_root() -> Path:
    return quantbench_home() / "masked"


def site_dir(key: str | None = None) -> Path:
    return masked_root() / f"{local_ort_version()}-{key or content_key()}" / "site"


def stamp_path(key: str | None = None) -> Path:
    return stamp_of(site_dir(key).parent)


def sites_path(key: str | None = None) -> Path:
    """Every patched site of the copy, one `REALPATH<TAB>hex file offset` line each (the shim's list)."""
    return site_dir(key).parent / "cpuid-sites.tsv"


def write_sites(site: Path, stamp: dict, out: Path) -> None:
    lines = [f"{os.path.realpath(site / rel)}\t{off:x}\n" for rel, entry in sorted(stamp["files"].items())
             for off in entry["offsets"]]
    atomic_write_text(out, "".join(lines))


def shim_path() -> Path:
    return masked_root() / f"shim-{hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:16]}.so"


def is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def load_segments(data: bytes) -> list[tuple[int, int, int]]:
    """(vaddr, filesz, offset) of each PT_LOAD segment of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    out = []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            out.append((p_vaddr, p_filesz, p_offset))
    return out


def file_offset(segments, vaddr: int) -> int:
    for start, size, offset in segments:
        if start <= vaddr < start + size:
            return vaddr - start + offset
    raise ValueError(f"address 0x{vaddr:x} is in no loaded segment")


def code_sections(data: bytes) -> dict:
    """{name: (vaddr, size, file offset, executable)} of a little-endian ELF64 file's allocated PROGBITS sections
    (empty when it has no section headers)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or not shnum or shstrndx >= shnum:
        return {}
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = {}
    for name, sh_type, flags, addr, offset, size in heads:
        if sh_type == 1 and flags & 0x2:   # SHT_PROGBITS, SHF_ALLOC
            label = data[names_at + name:data.index(b"\0", names_at + name)].decode(errors="replace")
            out[label] = (addr, size, offset, bool(flags & 0x4))   # SHF_EXECINSTR
    return out


def function_starts(data: bytes, sections: dict) -> list[int] | None:
    """The sorted entry addresses of every function the unwind table (.eh_frame_hdr's binary-search table, as GCC
    and Clang write it: datarel sdata4 pairs) lists, or None where it is absent or encoded otherwise."""
    if ".eh_frame_hdr" not in sections:
        return None
    addr, _size, off, _x = sections[".eh_frame_hdr"]
    version, ptr_enc, count_enc, table_enc = data[off:off + 4]
    if (version, ptr_enc, count_enc, table_enc) != (1, 0x1B, 0x03, 0x3B):
        return None
    count, = struct.unpack_from("<I", data, off + 8)
    table = struct.unpack_from(f"<{2 * count}i", data, off + 12)
    return sorted(addr + table[2 * i] for i in range(count))


def _objdump(path: Path, *args: str) -> bytes:
    try:
        return subprocess.run(["objdump", "-d", "--no-show-raw-insn", *args, str(path)], capture_output=True,
                              check=True).stdout
    except FileNotFoundError:
        raise UserError("masked hosts need objdump (Debian package binutils) to find cpuid instructions") from None
    except subprocess.CalledProcessError as exc:
        raise UserError(f"{path}: objdump failed "
                        f"({exc.stderr.decode(errors='replace').strip()[:200]})") from None


def _cpuid_lines(out: bytes) -> list[int]:
    found = []
    for word in re.finditer(rb"cpuid", out):
        line = _CPUID_LINE.match(out, out.rfind(b"\n", 0, word.start()) + 1)
        if line and line.end() == word.end():
            found.append(int(line.group(1), 16))
    return found


def cpuid_windows(data: bytes | bytearray) -> list[tuple[int, int]] | None:
    """The address ranges to disassemble to find every cpuid: for each 0F A2 in a code section, from the entry of
    the function holding it (the unwind table's, or the section's start) to an instruction past it; ranges sharing
    an entry, or nearer than MERGE_GAP, merged. None where the file has no usable unwind table (then the whole
    file is disassembled)."""
    sections = code_sections(data)
    starts = function_starts(data, sections) if sections else None
    if starts is None:
        return None
    windows: dict = {}
    for addr, size, offset, executable in sections.values():
        if not executable:
            continue
        at = data.find(CPUID, offset, offset + size)
        while at != -1:
            vaddr = addr + at - offset
            i = bisect.bisect_right(starts, vaddr) - 1
            entry = max(addr, starts[i]) if i >= 0 else addr
            # past it by the longest x86 instruction: objdump decodes an instruction the stop address cuts as
            # bytes of its own, so a cut before the end of the one holding these bytes would misread them
            windows[entry] = max(windows.get(entry, 0), vaddr + len(CPUID) + MAX_INSN)
            at = data.find(CPUID, at + 1, offset + size)
    merged: list = []
    for start, stop in sorted(windows.items()):   # a near neighbour costs less decoded on than started again
        if merged and start - merged[-1][1] < MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [tuple(w) for w in merged]


def cpuid_addresses(path: Path, data: bytes | bytearray | None = None) -> list[int]:
    """Virtual addresses of every cpuid instruction objdump decodes in the file's code sections.

    A 35 MB library disassembles to 250 MB of text (10 s of CPU); its 0F A2 byte pairs are a few dozen. Each is
    decoded from the entry of its function (a true instruction boundary: the unwind table lists every compiled
    function's) to an instruction past it, where objdump's linear sweep of the whole file meets it at an instruction
    boundary exactly when decoding from the entry does; a test holds both equal on the libraries masked here."""
    data = Path(path).read_bytes() if data is None else data
    windows = cpuid_windows(data)
    if windows is None:
        return cpuid_addresses_whole(path)
    found = set()
    for start, stop in windows:
        found.update(_cpuid_lines(_objdump(path, f"--start-address=0x{start:x}", f"--stop-address=0x{stop:x}")))
    return sorted(found)


def cpuid_addresses_whole(path: Path) -> list[int]:
    """cpuid_addresses by a linear sweep of the whole file (the reference the windows are held to)."""
    return _cpuid_lines(_objdump(path))


def patch_file(path: Path) -> dict:
    """Replace every cpuid of one ELF file (in place) by ud2; returns its sites and new SHA-256."""
    data = bytearray(path.read_bytes())
    addresses = cpuid_addresses(path, data)
    segments = load_segments(data)
    offsets = []
    for vaddr in addresses:
        off = file_offset(segments, vaddr)
        if data[off:off + 2] != CPUID:
            raise UserError(f"{path}: objdump's cpuid at 0x{vaddr:x} is not 0F A2 at file offset 0x{off:x}")
        data[off:off + 2] = UD2
        offsets.append(off)
    if offsets:
        path.write_bytes(data)
    return {"cpuid_sites": len(offsets), "offsets": offsets, "sha256": hashlib.sha256(data).hexdigest()}


def verify(site: Path, stamp: dict) -> str | None:
    """None when every patched file still has its recorded hash and ud2 at each site, else the problem.

    A file whose state (size, mtime, ctime, inode) is the one recorded when the copy was built and checked is
    not hashed again: only its sites are read. Any write to it changes its ctime, so it is hashed in full
    (~100 MB: 0.2 s of every command that starts a masked worker, before)."""
    for rel, entry in stamp.get("files", {}).items():
        path = site / rel
        try:
            if entry.get("state") == file_state(path):
                with open(path, "rb") as fh:
                    if any(os.pread(fh.fileno(), 2, o) != UD2 for o in entry["offsets"]):
                        return f"{path}: a patched site no longer holds ud2"
                continue
            data = path.read_bytes()
        except OSError:
            return f"{path} is missing"
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            return f"{path} changed since it was patched"
        if any(data[o:o + 2] != UD2 for o in entry["offsets"]):
            return f"{path}: a patched site no longer holds ud2"
    return None


def _copy_and_patch(tmp: Path, dirs: list[Path]) -> dict:
    elves = []
    for d in dirs:
        shutil.copytree(d, tmp / d.name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        elves += [p for p in sorted((tmp / d.name).rglob("*")) if p.is_file() and not p.is_symlink() and is_elf(p)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(elves, pool.map(patch_file, elves)))
    _compile(tmp, dirs)
    return {str(p.relative_to(tmp)): r for p, r in results.items() if r["cpuid_sites"]}


def _compile(tmp: Path, dirs: list[Path]) -> None:
    """The copy's bytecode, compiled once here for the place it will live (the __pycache__ of the originals is not
    copied: it names their paths): a worker that may not write bytecode (PYTHONDONTWRITEBYTECODE, common in
    containers) would otherwise compile numpy's and onnxruntime's Python on every start (0.2 s of its 0.27 s
    imports, measured)."""
    import compileall

    final = site_dir(content_key())
    for d in dirs:  # a file that does not compile (a test's deliberate syntax error) is compiled by no one
        compileall.compile_dir(str(tmp / d.name), ddir=str(final / d.name), quiet=2, workers=os.cpu_count() or 1)


def ensure_site(progress: bool = False) -> tuple[Path, dict, bool]:
    """The masked copy for this interpreter's packages, built when missing (once: fsutil.build_once; two masked
    hosts of one command, or two commands, wait for one builder): (site, stamp, built now)."""
    key = content_key()
    site = site_dir(key)
    if ("site", key) in _ONCE and site.is_dir():
        return site, _ONCE["site", key], False
    stamp, built = build_once(site, lambda: _checked_copy(key), lambda tmp: _build_copy(tmp, key, progress),
                              publish=lambda stamp: _publish_copy(site, stamp, key),
                              waiting=lambda: progress and print(f"masked: waiting for {site} (another quantbench "
                                                                 "is building it) ...", flush=True))
    _ONCE["site", key] = stamp
    return site, stamp, built


def _checked_copy(key: str) -> dict | None:
    """The stamp of the masked copy `key` when it is in place and intact, else None."""
    site = site_dir(key)
    stamp = read_stamp(site.parent)
    if stamp is not None and site.is_dir() and sites_path(key).exists() and verify(site, stamp) is None:
        return stamp
    return None


def _build_copy(tmp: Path, key: str, progress: bool) -> dict:
    """Copy and patch the packages into `tmp` (the builder's own folder); their stamp, checked."""
    dirs = _package_dirs()
    if progress:
        print(f"masked: copying {', '.join(d.name for d in dirs)} to {site_dir(key)} and patching cpuid ...",
              flush=True)
    files = _copy_and_patch(tmp, dirs)
    stamp = {"key": key, "onnxruntime": local_ort_version(), "sources": [str(d) for d in dirs], "files": files}
    problem = verify(tmp, stamp)
    if problem:
        raise UserError(f"masked copy failed its check: {problem}")
    return stamp


def _publish_copy(site: Path, stamp: dict, key: str) -> dict:
    """The copy is in place: record each file's state (checked above; hashed again only when touched), the
    shim's list of sites, then the stamp (last: a copy without its stamp is rebuilt)."""
    for rel, entry in stamp["files"].items():
        entry["state"] = file_state(site / rel)
    write_sites(site, stamp, sites_path(key))
    atomic_write_json(stamp_path(key), stamp)
    prune_orphans(keep=key)
    return stamp


def prune_orphans(keep: str) -> list[str]:
    """Remove the masked copies whose every source package folder is gone (the venv they were copied from was
    deleted: no interpreter can run them again), but `keep`; returns their folder names. Each fresh checkout's
    venv keys a copy of its own (150 MB), so without this a machine that clones often fills its cache."""
    gone = []
    for stamp_file in sorted(masked_root().glob("*.json")):
        folder = stamp_file.with_suffix("")
        stamp = read_stamp(folder) or {}
        sources = stamp.get("sources") or []
        if stamp.get("key") in (None, keep) or not sources or any(Path(s).exists() for s in sources):
            continue
        stamp_file.unlink(missing_ok=True)   # first: a copy without its stamp is never used, only rebuilt
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder.name)
    return gone


def ensure_shim(progress: bool = False) -> tuple[Path, bool]:
    """The compiled shim (gcc -O2 -shared -fPIC), built when missing (once: fsutil.build_once): (path, built now)."""
    out = shim_path()
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None and not out.exists():  # nothing made, not even the lock
        raise UserError("masked hosts need a C compiler (gcc) to build the CPUID shim; install gcc, or use "
                        "the qemu mechanism (NAME:qemu)")

    def build(tmp: Path) -> Path:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            err = proc.stderr.strip()
            raise UserError(f"{SHIM_SOURCE}: {cc} failed: {err.splitlines()[-1] if err else proc.returncode}")
        os.chmod(tmp, 0o755)
        return out

    out, built = build_once(out, lambda: out if out.exists() else None, build, folder=False)
    if built and progress:
        print(f"masked: built the CPUID shim {out}", flush=True)
    return out, built


def state() -> tuple[bool, str]:
    """Whether the masked copy and the shim are in place (without building them)."""
    try:
        key = content_key()
    except UserError as exc:
        return False, str(exc)
    stamp = read_stamp(site_dir(key).parent)
    if stamp is None or not site_dir(key).is_dir():
        return False, f"the masked copy of onnxruntime {local_ort_version()} is missing ({site_dir(key)})"
    if not shim_path().exists():
        return False, f"the CPUID shim is not built ({shim_path()})"
    return True, f"masked copy {site_dir(key)}"
