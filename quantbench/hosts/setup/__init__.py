"""Builds what emulated hosts need under QUANTBENCH_HOME (layout: quantbench.hosts.emulated), one module per step.

Steps, each skipped when its stamp file says it is done, and each built once per entry (fsutil.build_once: a
lock beside the entry, a temporary folder of the builder's own, an atomic rename; a second command or thread
waits, then uses the finished entry):
  1. qemu-user (qemu.py): Debian trixie's qemu-user 10, fetched with a private apt configuration (apt.py);
  2. the arm64 root (debootstrap.py);
  3. aarch64 wheels of the local onnxruntime version (+ numpy) (wheels.py);
  4. one qemu -L prefix per preset, verified by a guest probe (prefix.py).
steps.py runs them in order for `hosts setup` and a host's first use; programs.py runs their programs.
The Debian mirror is the machine's own (its apt sources), or QUANTBENCH_DEBIAN_MIRROR.
"""

from quantbench.hosts.setup.programs import ProbeDied, SetupError
from quantbench.hosts.setup.steps import first_use_setup, setup_emulated, setup_hosts

__all__ = ["ProbeDied", "SetupError", "first_use_setup", "setup_emulated", "setup_hosts"]
