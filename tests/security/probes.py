"""Programs the attacks run inside a sandbox: plain python3 from the default image, no tools needed."""

from __future__ import annotations

SYSCALL = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "for spec in sys.argv[1:]:\n"
    "    name, *nums = spec.split(':')\n"
    "    args = [ctypes.c_long(int(n, 0)) for n in nums] + [ctypes.c_long(0)] * (7 - len(nums))\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.syscall(*args[:7])\n"
    "    print(name, r, ctypes.get_errno())\n"
)
"""``python3 -c SYSCALL name:nr[:arg...] ...`` prints ``name result errno`` per call."""

CONNECT = (
    "import socket, sys\n"
    "target = sys.argv[1]\n"
    "try:\n"
    "    if target.startswith(('/', '@')):\n"
    "        s = socket.socket(socket.AF_UNIX)\n"
    "        s.settimeout(1)\n"
    "        s.connect('\\0' + target[1:] if target.startswith('@') else target)\n"
    "    else:\n"
    "        socket.create_connection((target, int(sys.argv[2])), timeout=1)\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('error', e.errno)\n"
)
"""``python3 -c CONNECT HOST PORT`` or ``CONNECT /path|@abstract``: prints ``connected`` or ``error <errno>``."""


def syscall_results(stdout: bytes) -> dict[str, tuple[int, int]]:
    """Parse SYSCALL's output: name → (result, errno)."""
    found: dict[str, tuple[int, int]] = {}
    for line in stdout.decode().splitlines():
        name, result, err = line.split()
        found[name] = (int(result), int(err))
    return found
