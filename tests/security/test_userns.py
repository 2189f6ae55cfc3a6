"""Root inside is not root outside: each sandbox runs in its own user namespace, its root an
unprivileged host id range that no other sandbox shares, over an image whose files stay the host's."""

from __future__ import annotations

import ctypes
import fcntl
import os

import pytest

from grove.client import Grove, Sandbox
from router.backends.local.uids import FLOOR
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    layer_owner,
    to_plain_layer,
    wait_for,
    wait_removed,
)

RANGE = 65536
NS_GET_OWNER_UID = 0xB704  # ioctl_ns(2): _IO(0xb7, 0x4)


def host_ids(pid: int) -> tuple[int, int]:
    """A host process's real uid and gid."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def uid_map(sb: Sandbox) -> list[int]:
    result = sb.exec("cat /proc/self/uid_map")
    assert result.exit_code == 0, result.stderr
    return [int(n) for n in result.stdout.split()]


def test_root_inside_maps_to_an_unprivileged_range_of_its_own(pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    inside, base_a, count = uid_map(a)
    assert (inside, count) == (0, RANGE)
    _, base_b, _ = uid_map(b)
    assert base_a >= FLOOR and base_b >= FLOOR
    assert abs(base_a - base_b) >= RANGE  # no id in common
    assert a.exec("id -u; id -g").stdout == b"0\n0\n"  # SWE tasks expect root inside


def test_every_process_of_the_sandbox_is_unprivileged_on_the_host(
    router: RouterProcess, pair: tuple[Sandbox, Sandbox]
) -> None:
    a, _ = pair
    _, base, _ = uid_map(a)
    a.exec("sleep 30 >/dev/null 2>&1 &")
    pids = cgroup_procs(router.state_dir, a.id)
    assert len(pids) >= 2  # the executor (PID 1) and the sleep
    for pid in pids:
        assert host_ids(pid) == (base, base), f"host pid {pid} runs as {host_ids(pid)}, not the sandbox's root"
    a.exec("pkill sleep || true")


def test_files_written_inside_belong_to_the_range_and_the_image_is_untouched(
    router: RouterProcess, pair: tuple[Sandbox, Sandbox]
) -> None:
    a, _ = pair
    _, base, _ = uid_map(a)
    # Root inside owns the image's files (an idmapped mount) and can change them: copy-up works.
    listing = a.exec("stat -c '%u %g' /etc/passwd / /workspace /tmp && echo extra >> /etc/passwd && "
                     "touch /tmp/x && chown 1000:1000 /tmp/x && chmod 4755 /tmp/x")
    assert listing.exit_code == 0, listing.stderr
    assert listing.stdout == b"0 0\n0 0\n0 0\n0 0\n"
    a.exec("sync")
    assert layer_owner(router.state_dir, a.id, "etc/passwd") == (base, base)
    assert layer_owner(router.state_dir, a.id, "tmp/x") == (base + 1000, base + 1000)
    image_passwd = router.layout.images / "default"
    found = [p for p in image_passwd.rglob("passwd") if p.parent.name == "etc"]
    assert found, "the default image has an /etc/passwd"
    for path in found:
        assert path.stat().st_uid == 0 and b"extra" not in path.read_bytes()


def _namespace_links(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.split(":", 1)[0] in ("pid", "mnt", "net", "user", "uts", "ipc", "cgroup", "time"):
            found.append(target)
    return found


def test_the_namespace_is_owned_by_the_sandboxs_root(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    # The owner is whoever created it (effective ids at the clone, sandbox_image/userns.py): the sandbox's root,
    # not host root, so the kernel's per-owner counters (inotify, mqueue) are each sandbox's own.
    a, _ = pair
    _, base, _ = uid_map(a)
    pid = cgroup_procs(router.state_dir, a.id)[0]
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    try:
        owner = ctypes.c_uint(0)
        assert fcntl.ioctl(fd, NS_GET_OWNER_UID, owner) == 0
    finally:
        os.close(fd)
    assert owner.value == base
    assert a.exec("true").exit_code == 0


def test_pid1_holds_no_handle_on_a_namespace(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    # The zygote forks PID 1 into a new PID namespace and keeps a descriptor of the host's to return to;
    # PID 1 must not inherit it (nor keep the user namespace's once it has entered it).
    a, _ = pair
    pid1 = []
    for pid in cgroup_procs(router.state_dir, a.id):
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            nspid = next(line for line in fh if line.startswith("NSpid:")).split()[1:]
        if nspid[-1] == "1":
            pid1.append(pid)
    assert len(pid1) == 1
    assert _namespace_links(pid1[0]) == []


def test_root_inside_has_no_power_over_the_host_owned_namespaces(pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    # Owned by the host's user namespace: root inside cannot rename the host, touch the network
    # or the kernel's knobs, even where a capability it holds would allow it in a namespace it owned.
    probe = a.exec(
        "hostname other 2>&1; echo rc=$?; "
        "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\" "
        "2>&1 | tail -1; "
        "echo 1 > /proc/sys/net/ipv4/ip_forward 2>&1; echo rc=$?"
    )
    lines = probe.stdout.decode().splitlines()
    assert lines[1] == "rc=1" and "PermissionError" in lines[2], lines  # hostname, raw socket
    assert lines[-1] != "rc=0", lines  # /proc/sys
    assert a.exec("hostname").stdout.decode().strip() == a.id[:63]


def test_a_setuid_root_binary_gains_nothing_on_the_host(router: RouterProcess, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    _, base, _ = uid_map(a)
    made = a.exec("cp /bin/sleep /tmp/suid-sleep && chmod 4755 /tmp/suid-sleep")
    assert made.exit_code == 0, made.stderr
    # Run by nobody, a setuid-root program becomes the sandbox's root: on the host, still just `base`.
    started = a.exec("/tmp/suid-sleep 30 >/dev/null 2>&1 & sleep 0.3", user="nobody")
    assert started.exit_code == 0, started.stderr
    found = []
    for pid in cgroup_procs(router.state_dir, a.id):
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        if fields["Name"].strip() == "suid-sleep":
            real, effective = (int(n) for n in fields["Uid"].split()[:2])
            found.append((real, effective))
    assert found == [(base + 65534, base)], found
    a.exec("kill $(pidof suid-sleep) 2>/dev/null; true")


def test_commands_run_as_another_user_on_request(grove: Grove, pair: tuple[Sandbox, Sandbox]) -> None:
    a, _ = pair
    assert a.exec("id", user="nobody").stdout.decode().startswith("uid=65534(nobody) gid=65534(nogroup)")
    numeric = a.exec("id -u; id -g; echo $HOME; touch /workspace/mine 2>&1; echo rc=$?", user="1000:1000")
    assert numeric.stdout.decode().splitlines()[:3] == ["1000", "1000", "/"], numeric.stdout
    assert "rc=1" in numeric.stdout.decode()  # /workspace is root's
    a.exec("mkdir -p /home/u && chown 1000:1000 /home/u")
    made = a.exec("touch f && stat -c %u f", user="1000", cwd="/home/u")
    assert made.stdout == b"1000\n", made.stderr
    assert a.exec("id -u").stdout == b"0\n"  # the default stays root


@pytest.mark.parametrize(
    ("user", "needle"),
    [
        ("nosuchuser", "no user 'nosuchuser'"),
        ("root:nosuchgroup", "no group 'nosuchgroup'"),
        ("-1", "between 0 and 65535"),
        ("70000", "between 0 and 65535"),
        ("", "user"),
        ("a:b:c", "user"),
    ],
)
def test_a_bad_user_is_a_clear_error(pair: tuple[Sandbox, Sandbox], user: str, needle: str) -> None:
    a, _ = pair
    with pytest.raises(Exception) as caught:
        a.exec("true", user=user)
    status = getattr(caught.value, "status", None)
    assert status in (400, 404, 422), repr(caught.value)
    assert needle in str(caught.value), str(caught.value)


def test_the_range_and_the_owners_survive_scale_to_zero(router: RouterProcess) -> None:
    with router.client() as grove:
        sb = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=60)
        try:
            before = uid_map(sb)
            sb.exec("echo kept > /root/note && chown 7:7 /root/note")
            wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "idle", 8, 0.1,
                     "the sandbox to scale to zero")
            assert uid_map(sb) == before  # woken by the call, in the same range
            again = sb.exec("cat /root/note; stat -c '%u %g' /root/note; echo more >> /root/note")
            assert again.stdout == b"kept\n7 7\n", again.stderr
        finally:
            sb.close()
    wait_removed(router.state_dir, sb.id)
    assert not os.path.exists(router.layout.sandbox(sb.id))


def test_a_layer_from_before_user_namespaces_is_shifted_into_the_range(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=120)
        sb.exec("echo old > /root/note && mkdir -p /home/u && touch /home/u/f && chown -R 1000:1000 /home/u")
        wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "idle", 8, 0.1,
                 "the sandbox to scale to zero")
    router.stop()
    # What an older grove left: no range file, a layer owned by plain host ids.
    sandbox_dir = router.layout.sandbox(sb.id)
    (sandbox_dir / "userns").unlink()
    to_plain_layer(sandbox_dir)
    layer = sandbox_dir / "upper"
    for path in [layer, *layer.rglob("*")]:
        st = path.lstat()
        os.lchown(path, st.st_uid % RANGE, st.st_gid % RANGE)
    assert (layer / "home" / "u" / "f").stat().st_uid == 1000
    router.start()
    with router.client() as grove:
        again = grove.attach(sb.id)
        _, base, _ = uid_map(again)
        seen = again.exec("cat /root/note; stat -c '%u %g' /root/note /home/u/f; echo new >> /root/note")
        assert seen.stdout == b"old\n0 0\n1000 1000\n", seen.stderr
        assert seen.exit_code == 0, seen.stderr
        assert (layer / "home" / "u" / "f").stat().st_uid == base + 1000
        again.close()
