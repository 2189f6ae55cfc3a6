"""grove's seccomp filter for every architecture it is built for, checked without running that architecture.

The numbers come from the kernel's own headers as installed here (linux-libc-dev: ``asm-generic/unistd.h``
is the table aarch64 uses, ``asm/unistd_64.h`` x86-64's), never from grove's tables. The program is run
by a small classic-BPF interpreter written from ``linux/bpf_common.h``; that interpreter is checked
against the kernel itself on this machine's x86-64 filter, so what it says about the aarch64 filter —
which this x86-64 machine cannot install — is what an arm64 node's kernel would do.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from sandbox_image import seccomp
from sandbox_image.syscalls import AARCH64, X86_64, Arch, current

pytestmark = pytest.mark.fast  # pure logic plus one short child process

INCLUDE = Path("/usr/include")
GENERIC_UNISTD = INCLUDE / "asm-generic" / "unistd.h"
X86_64_UNISTD = INCLUDE / "x86_64-linux-gnu" / "asm" / "unistd_64.h"
TABLES = [(AARCH64, GENERIC_UNISTD), (X86_64, X86_64_UNISTD)]


def defines(path: Path, prefix: str = "") -> dict[str, int]:
    """``#define NAME number`` lines of a header (decimal or hex), by name without ``prefix``."""
    found = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)U?\b", path.read_text(), re.M):
        if m.group(1).startswith(prefix):
            found[m.group(1)[len(prefix):]] = int(m.group(2), 0)
    return found


@cache
def kernel() -> dict[str, int]:
    """Constants of the BPF, seccomp and audit ABI, from the kernel's headers."""
    bpf = defines(INCLUDE / "linux" / "bpf_common.h")
    ret = defines(INCLUDE / "linux" / "seccomp.h", "SECCOMP_RET_")
    em = defines(INCLUDE / "linux" / "elf-em.h", "EM_")
    audit = defines(INCLUDE / "linux" / "audit.h", "__AUDIT_ARCH_")
    return {
        "ld_w_abs": bpf["BPF_LD"] | bpf["BPF_W"] | bpf["BPF_ABS"],
        "jeq": bpf["BPF_JMP"] | bpf["BPF_JEQ"] | bpf["BPF_K"],
        "jge": bpf["BPF_JMP"] | bpf["BPF_JGE"] | bpf["BPF_K"],
        "jset": bpf["BPF_JMP"] | bpf["BPF_JSET"] | bpf["BPF_K"],
        "ret": bpf["BPF_RET"] | bpf["BPF_K"],
        "allow": ret["ALLOW"], "errno": ret["ERRNO"], "kill": ret["KILL_PROCESS"],
        # AUDIT_ARCH_* are (EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE) in linux/audit.h.
        "aarch64": em["AARCH64"] | audit["64BIT"] | audit["LE"],
        "x86_64": em["X86_64"] | audit["64BIT"] | audit["LE"],
        "arm": em["ARM"] | audit["LE"],
        "i386": em["386"] | audit["LE"],
    }


def evaluate(program: list[tuple[int, int, int, int]], nr: int, arch: int, *args: int) -> int:
    """What the kernel's classic-BPF interpreter returns for one ``struct seccomp_data``."""
    k = kernel()
    # struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; } (little endian)
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    acc, pc = 0, 0
    while True:
        code, jt, jf, value = program[pc]
        pc += 1
        if code == k["ld_w_abs"]:
            acc = struct.unpack_from("<I", data, value)[0]
        elif code in (k["jeq"], k["jge"], k["jset"]):
            taken = {k["jeq"]: acc == value, k["jge"]: acc >= value, k["jset"]: bool(acc & value)}[code]
            pc += jt if taken else jf
        elif code == k["ret"]:
            return value
        else:
            raise AssertionError(f"instruction {code:#x} at {pc - 1} is not one this check knows")


def answer(result: int) -> str:
    """``allow``, ``kill`` or the errno's name."""
    k = kernel()
    if result == k["allow"]:
        return "allow"
    if result == k["kill"]:
        return "kill"
    assert result & 0xFFFF0000 == k["errno"], hex(result)
    return errno.errorcode[result & 0xFFFF]


def expected(name: str) -> str:
    """What a call by name with all-zero arguments must get: the module docstring's rules, written again."""
    if name in seccomp.DENIED:
        return "EPERM"
    if name in ("clone3", "io_setup"):
        return "ENOSYS"
    if name in ("socket", "socketpair"):
        return "EAFNOSUPPORT"  # family 0, AF_UNSPEC, is no family a sandbox may use
    return "allow"  # clone without namespace flags, personality(PER_LINUX), and every other call


@pytest.mark.parametrize("arch, header", TABLES, ids=["aarch64", "x86_64"])
def test_every_number_is_the_kernels(arch: Arch, header: Path) -> None:
    table = defines(header, "__NR_")
    assert {name: table.get(name) for name in arch.numbers} == dict(arch.numbers)
    # A denied call with no number of grove's is one the architecture does not have at all.
    missing = [name for name in seccomp.DENIED if name not in arch.numbers]
    assert not [name for name in missing if name in table], missing
    if arch is AARCH64:
        assert {"create_module", "uselib", "iopl", "ioperm", "_sysctl"} <= set(missing)


@pytest.mark.parametrize("arch, header", TABLES, ids=["aarch64", "x86_64"])
def test_every_system_call_of_the_architecture_gets_what_the_rules_say(arch: Arch, header: Path) -> None:
    program = seccomp.program(arch)
    audit_arch = kernel()[arch.name]
    assert arch.audit_arch == audit_arch
    table = defines(header, "__NR_")
    table = {name: nr for name, nr in table.items() if name not in ("syscalls", "arch_specific_syscall")}
    got = {name: answer(evaluate(program, nr, audit_arch)) for name, nr in table.items()}
    want = {name: expected(name) for name in table}
    assert got == want
    assert sum(1 for v in got.values() if v == "allow") > 250  # ordinary calls (read, openat, execve ...) pass


def test_the_aarch64_filter_checks_arguments_like_the_x86_64_one() -> None:
    program, arch = seccomp.program(AARCH64), kernel()["aarch64"]
    nr = defines(GENERIC_UNISTD, "__NR_")

    def call(name: str, *args: int) -> str:
        return answer(evaluate(program, nr[name], arch, *args))

    assert call("clone", 0x10000011) == "EPERM"  # CLONE_NEWUSER | SIGCHLD
    assert call("clone", 0x003D0F00) == "allow"  # a thread: CLONE_VM | FS | FILES | SIGHAND | THREAD ...
    assert call("socket", 2, 1, 0) == "allow" and call("socket", 10, 2, 0) == "allow"  # AF_INET, AF_INET6
    assert call("socketpair", 1, 1, 0) == "allow"  # AF_UNIX
    assert call("socket", 40, 1, 0) == "EAFNOSUPPORT"  # AF_VSOCK
    assert call("socket", 16, 3, 0) == "allow" and call("socket", 16, 3, 4) == "allow"  # NETLINK_ROUTE, SOCK_DIAG
    assert call("socket", 16, 3, 9) == "EPROTONOSUPPORT"  # NETLINK_AUDIT
    assert call("personality", 0x0400000) == "EPERM"  # READ_IMPLIES_EXEC
    assert call("personality", 0xFFFFFFFF) == "allow" and call("personality", 0x40000) == "allow"
    # Any other ABI is killed: 32-bit ARM tasks, and x86-64's numbers if they ever arrived.
    assert answer(evaluate(program, nr["getpid"], kernel()["arm"])) == "kill"
    assert answer(evaluate(program, nr["getpid"], kernel()["x86_64"])) == "kill"


def test_the_x86_64_program_is_unchanged() -> None:
    """Bit for bit the filter the security suites were run against before aarch64 was added."""
    raw = b"".join(struct.pack("<HBBI", *insn) for insn in seccomp.program(X86_64))
    assert len(raw) // 8 == 78
    assert hashlib.sha256(raw).hexdigest() == "8e12435fba4a0ee04b88a8526766df7c0a4b3e790bef68761299d8e3767f20fc"


_PROBE = """
import ctypes, json, sys
from sandbox_image import seccomp
seccomp.install()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = []
for nr, *args in json.loads(sys.argv[1]):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    out.append(0 if r >= 0 else ctypes.get_errno())
print(json.dumps(out))
"""


def test_the_interpreter_agrees_with_the_kernel() -> None:
    """This machine's filter installed for real in a child: each call fails (or not) as :func:`evaluate` says."""
    arch = current()
    assert arch is not None, "grove's filter has a table for every architecture its tests run on"
    nr = defines({"x86_64": X86_64_UNISTD, "aarch64": GENERIC_UNISTD}[arch.name], "__NR_")
    probes = [[nr["getpid"]], [nr["unshare"], 0x10000000], [nr["clone3"], 0, 0], [nr["io_setup"], 0, 0],
              [nr["socket"], 40, 1, 0], [nr["socket"], 16, 3, 9], [nr["personality"], 0x0400000],
              [nr["personality"], 0xFFFFFFFF], [nr["keyctl"], 0, -3], [nr["getuid"]]]
    child = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(probes)], capture_output=True, text=True,
                           timeout=30, check=False)
    assert child.returncode == 0, child.stderr
    from_kernel = ["allow" if e == 0 else errno.errorcode[e] for e in json.loads(child.stdout)]
    program = seccomp.program(arch)
    from_interpreter = [answer(evaluate(program, n, kernel()[arch.name], *(a & 0xFFFFFFFF for a in args)))
                        for n, *args in probes]
    assert from_kernel == from_interpreter
    assert from_kernel == ["allow", "EPERM", "ENOSYS", "ENOSYS", "EAFNOSUPPORT", "EPROTONOSUPPORT", "EPERM",
                           "allow", "EPERM", "allow"]
