"""The worker: runs on every host, needs only the standard library, numpy and onnxruntime.

Its modules must stay self-contained (Python 3.9+; of quantbench only the canonical tensor encoding,
quantbench/tensorcode.py), because they run on bare hosts (an emulated arm64 root, a Raspberry Pi over ssh, a
commissioning kit): the frames (protocol.py), onnxruntime sessions (session.py), what can change the numbers
(fingerprint.py) and the request loop that is the worker's entry (jobs.py). Started by path, jobs.py loads its
sibling sources; sent as source, it receives them first (jobs.SOURCES, hosts.process.worker_source).
onnxruntime is imported lazily, so the rest of quantbench imports the protocol from here without loading it.
"""

from quantbench.worker.fingerprint import (ARM64_HWCAP, ARM64_HWCAP2, AT_HWCAP, AT_HWCAP2, X86_FLAGS,
                                           arm_vector_lengths, collect_fingerprint, cpuid_function, cpuid_leaves,
                                           decode_bits, fingerprint_id, masked_problem, read_auxv, read_cpuinfo,
                                           x86_identity)
from quantbench.worker.protocol import MAGIC, PROTOCOL, JobError, read_frame, write_frame
from quantbench.worker.jobs import SOURCES, install_sources, run_job, serve
from quantbench.worker.session import (DEFAULT_SESSION, GRAPH_OPT_LEVELS, PROFILE_PREFIX, REQUIRED, SessionOptions,
                                       make_session, normalize_session, provider_problems, read_placement)

__all__ = ["ARM64_HWCAP", "ARM64_HWCAP2", "AT_HWCAP", "AT_HWCAP2", "DEFAULT_SESSION", "GRAPH_OPT_LEVELS", "JobError",
           "MAGIC", "PROFILE_PREFIX", "PROTOCOL", "REQUIRED", "SOURCES", "SessionOptions", "X86_FLAGS",
           "arm_vector_lengths", "collect_fingerprint", "cpuid_function", "cpuid_leaves", "decode_bits",
           "fingerprint_id", "install_sources", "make_session", "masked_problem", "normalize_session",
           "provider_problems", "read_auxv", "read_cpuinfo", "read_frame", "read_placement", "run_job", "serve",
           "write_frame", "x86_identity"]
