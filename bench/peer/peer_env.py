"""bench/peer/peer_env.py - puts a PyTorch peer at its best before torch loads,
and says what it ran.

Every peer script calls ensure() first thing, before it imports torch:

- OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed.  Some hosts set them
  (OPENBLAS_CORETYPE=Haswell on CPUs the installed OpenBLAS does not know),
  which holds OpenBLAS, and PyTorch's f32 GEMMs through it, to AVX2 kernels
  on AVX-512 CPUs; unset, OpenBLAS picks its kernels for the CPU it finds.
- glibc's malloc keeps large freed blocks instead of returning them to the
  system (GLIBC_TUNABLES mmap_threshold and trim_threshold at 2 GB): by
  default PyTorch's large per-step tensors are mapped and unmapped every
  step (PyTorch's CPU allocator keeps no cache of its own).  On bench/
  train_step's MLP on a 2-core Zen 4 VM that was 2,200-2,700 page faults a
  step and 1.1-1.3x the CPU time a step takes without them (26-34 faults).
- OMP_WAIT_POLICY=passive (unless set): with OpenMP's default, spinning,
  the idle worker threads keep the other core of a 2-core machine busy.

glibc reads GLIBC_TUNABLES only when a process starts, so when any of these
is not as wanted the script executes itself again with them fixed (once:
the second time they are as wanted, or it stops with an error).  Only the peer's process sees them:
the C bench that runs a peer keeps its own environment.

describe(torch) is the line each peer prints before it measures: torch's
version, its threads, the OpenBLAS core it loaded (openblas_get_corename,
through ctypes) and ATen's vector level.
"""
import ctypes
import os
import sys

TUNABLES = ("glibc.malloc.mmap_threshold=2000000000:"
            "glibc.malloc.trim_threshold=2000000000")
UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
AGAIN = "NT_PEER_ENV_AGAIN"  # set for the second start: there is no third


def _wanted(env):
    """What env lacks, as a list of changes (empty: nothing to do)."""
    todo = [name for name in UNSET if name in env]
    if TUNABLES not in env.get("GLIBC_TUNABLES", ""):
        todo.append("GLIBC_TUNABLES")
    if "OMP_WAIT_POLICY" not in env:
        todo.append("OMP_WAIT_POLICY")
    return todo


def ensure():
    """Executes this script again with the peer's environment, unless it
    already has it; returns only when it does."""
    env = dict(os.environ)
    todo = _wanted(env)
    if not todo:
        return
    if env.get(AGAIN):
        raise RuntimeError("peer_env.ensure(): started again, still not as wanted: "
                           + ", ".join(todo))
    if "torch" in sys.modules:
        raise RuntimeError("peer_env.ensure() must run before torch is imported")
    for name in UNSET:
        env.pop(name, None)
    if "GLIBC_TUNABLES" in todo:
        old = env.get("GLIBC_TUNABLES", "")
        # later entries win, so the user's other tunables are kept
        env["GLIBC_TUNABLES"] = old + ":" + TUNABLES if old else TUNABLES
    env.setdefault("OMP_WAIT_POLICY", "passive")
    env[AGAIN] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def _openblas():
    """(core name, thread count) of the OpenBLAS this process loaded, or
    ("none", 0) when it loaded none."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line and "/" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            core = lib.openblas_get_corename
        except (OSError, AttributeError):
            continue
        core.restype = ctypes.c_char_p
        return core().decode(), lib.openblas_get_num_threads()
    return "none", 0


def describe(torch):
    """One line: what the peer runs on (torch must be imported)."""
    core, blas_threads = _openblas()
    level = "unknown"
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            level = line.split(":", 1)[1].strip()
    return (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); OpenBLAS core "
            f"{core} ({blas_threads} thread(s)); ATen vector level {level}; "
            f"OPENBLAS_CORETYPE {os.environ.get('OPENBLAS_CORETYPE', 'unset')}; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')}; "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}")
