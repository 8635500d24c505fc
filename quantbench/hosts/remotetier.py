"""A masked x86 tier on another machine: its ssh host shows the tiers its own CPU covers (`NAME:TIER`).

The remote needs what a local masked tier needs (x86-64 Linux, python3 with numpy and onnxruntime, gcc and
objdump), nothing of quantbench installed: the connection carries, before the worker, the few quantbench modules
that build the masked copy (hosts.masked, hosts.cpuidpatch and what they import: standard library, numpy and
onnxruntime only) as a zip. TIER_BOOTSTRAP unpacks it once into the remote's quantbench cache (keyed by its
hash), then `exec_worker` checks the remote CPU has the tier's features, builds (once, under its lock) and checks
the masked copy and the shim there, and replaces itself with the ordinary worker bootstrap under the mask's
environment; the rest of the connection's input is the worker as for any ssh host. `hosts setup NAME:TIER` runs
the same up to the copy and prints what it did.
"""

from __future__ import annotations

import io
import json
import os
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

from quantbench.errors import UserError
from quantbench.hosts import cpuidpatch
from quantbench.hosts import cpuprofiles
from quantbench.hosts import masked
from quantbench.hosts.process import BOOTSTRAP
from quantbench.worker import cpuid_function, cpuid_leaves, x86_identity

#: the remote's first program: reads the code zip (its length, then its bytes), the tier and the mode (`worker`
#: or `setup`) from fd 0 unbuffered (the worker reads the rest of the stream after the exec), unpacks the zip once
#: into QUANTBENCH_HOME/code/<hash>, and hands over to exec_worker
TIER_BOOTSTRAP = (
    "import os,sys,io,hashlib,zipfile,tempfile,shutil\n"
    "def rd(n):\n b=b''\n while len(b)<n:\n  c=os.read(0,n-len(b))\n  if not c: sys.exit('quantbench: input ended early')\n"
    "  b+=c\n return b\n"
    "def ln():\n b=b''\n while not b.endswith(b'\\n'): b+=rd(1)\n return b.decode().strip()\n"
    "z=rd(int(ln()));tier,mode=ln().split()\n"
    "home=os.environ.get('QUANTBENCH_HOME') or os.path.join(os.path.expanduser('~'),'.cache','quantbench')\n"
    "d=os.path.join(home,'code',hashlib.sha256(z).hexdigest()[:16])\n"
    "if not os.path.isdir(d):\n os.makedirs(os.path.dirname(d),exist_ok=True)\n"
    " t=tempfile.mkdtemp(prefix='.code.',dir=os.path.dirname(d));zipfile.ZipFile(io.BytesIO(z)).extractall(t)\n"
    " try: os.rename(t,d)\n except OSError: shutil.rmtree(t,ignore_errors=True)\n"
    "sys.path.insert(0,d)\n"
    "from quantbench.hosts.remotetier import exec_worker\nexec_worker(tier,mode)\n"
)
#: the modules the remote imports (hosts.masked's closure) and the shim's source
_MODULES = ("__init__", "errors", "fsutil", "tensorcode", "inputs/__init__", "inputs/assets", "hosts/__init__",
            "hosts/cpuidpatch", "hosts/cpuprofiles", "hosts/keys", "hosts/masked", "hosts/process", "hosts/remotetier",
            "hosts/runtimes", "worker/__init__", "worker/protocol", "worker/session", "worker/fingerprint",
            "worker/jobs")


@lru_cache(maxsize=1)
def code_zip() -> bytes:
    """The quantbench code the remote runs (same sources, same bytes: fixed member times and order)."""
    root = Path(__file__).resolve().parents[1]
    files = [f"{m}.py" for m in _MODULES] + ["hosts/cpuid_shim.c"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            z.writestr(zipfile.ZipInfo(f"quantbench/{rel}", (1980, 1, 1, 0, 0, 0)), (root / rel).read_bytes())
    return buf.getvalue()


def preamble(tier: str, mode: str) -> bytes:
    """What TIER_BOOTSTRAP reads before the worker's own preamble."""
    z = code_zip()
    return f"{len(z)}\n".encode() + z + f"{tier} {mode}\n".encode()


def exec_worker(tier: str, mode: str) -> None:
    """On the remote: the tier's masked copy (built when missing), then the worker under its mask (`worker`), or
    one JSON line saying what was done (`setup`). A CPU without the tier's features is one line and exit 3."""
    p = cpuprofiles.profile(tier)
    why = "unknown tier" if p is None else masked.masked_unavailable(p)
    if why:
        brand = x86_identity(cpuid_leaves(cpuid_function()[0])).get("model_name", "") if "lacks" in why else ""
        sys.stderr.write(f"quantbench: {tier} on this machine{f' ({brand})' if brand else ''}: {why}\n")
        sys.exit(3)
    try:
        done = masked.setup_masked(progress=False)
    except UserError as exc:
        sys.stderr.write(f"quantbench: {tier} on this machine: {exc}\n")
        sys.exit(3)
    if mode == "setup":
        print(json.dumps({"done": done, "site": str(cpuidpatch.site_dir()), "shim": str(cpuidpatch.shim_path())}))
        return
    env = masked.worker_env(p, cpuidpatch.site_dir(), cpuidpatch.shim_path())
    os.execve(sys.executable, [sys.executable, "-u", "-c", BOOTSTRAP], env)
