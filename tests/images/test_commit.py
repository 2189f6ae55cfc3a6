"""``POST /v1/sandboxes/{id}/commit`` through a real router: a sandbox's writable layer (new files, owners,
a deleted base file) becomes an image new sandboxes start from, sharing the base's layers; bad input is refused."""

from __future__ import annotations

from pathlib import Path

from grove.client import Grove
from tests.support.registry import Registry, write_oci_layout
from tests.support.router_fixtures import RouterProcess


def pulled_base(router: RouterProcess, registry: Registry, base_layer: bytes, tmp: Path, repo: str) -> str:
    """The busybox base pushed to the registry and pulled into the router's store; its reference."""
    write_oci_layout(tmp / repo, [[base_layer]])
    registry.push(tmp / repo, f"{repo}:1")
    ref = registry.ref(f"{repo}:1")
    done = router.cli("image", "pull", "--insecure", ref, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return ref


def test_commit_makes_an_image_of_the_layer(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path
) -> None:
    base = pulled_base(router, registry, base_layer, tmp_path, "commitbase")
    with grove.create(base) as sb:
        r = sb.exec("mkdir -p /srv/app && echo hello > /srv/app/a && chown 1000:1000 /srv/app/a && "
                    "rm /bin/ls && ln -s a /srv/app/link && rm -r /etc && mkdir /etc && echo x > /etc/only")
        assert r.exit_code == 0, r.stderr
        reply = router.http("POST", f"/v1/sandboxes/{sb.id}/commit", json_body={"image": "committed"})
        assert reply.status == 201, reply.body
        answer = reply.json()
        # Still running, and still writable after the thaw.
        assert sb.exec("echo after > /srv/app/b && cat /srv/app/b").stdout == b"after\n"
    assert answer["image"] == "committed" and len(answer["layers"]) == 2
    with grove.create("committed") as again:
        r = again.exec("cat /srv/app/a; readlink /srv/app/link; stat -c '%u:%g' /srv/app/a; "
                       "test -e /bin/ls || echo ls-gone; test -e /srv/app/b || echo b-later; ls /etc")
        # The deleted file and the replaced directory (opaque in the layer) stay so in the image.
        assert r.stdout == b"hello\na\n1000:1000\nls-gone\nb-later\nonly\n", r.stderr
        assert again.info["image_digest"] == answer["digest"]
    # The base's layer is the one the pull stored, named by both images.
    base_layer_id = router.http("POST", f"/v1/images/{base}", json_body={"source": base}).json()["layers"][0]
    assert answer["layers"][0] == base_layer_id


def test_commit_refuses_bad_input(router: RouterProcess, grove: Grove) -> None:
    with grove.create() as sb:
        bad = router.http("POST", f"/v1/sandboxes/{sb.id}/commit", json_body={"image": "Bad Name!"})
        assert bad.status == 422 and "invalid image name" in bad.json()["error"]["message"]
        unknown = router.http("POST", f"/v1/sandboxes/{sb.id}/commit", json_body={"image": "x", "colour": 1})
        assert unknown.status == 400, unknown.body
        host = router.http("POST", f"/v1/sandboxes/{sb.id}/commit", json_body={"image": "ondefault"})
        assert host.status == 422 and "this host's /usr" in host.json()["error"]["message"]
        assert sb.exec("echo still").stdout == b"still\n"  # nothing else disturbed
    missing = router.http("POST", "/v1/sandboxes/sb-nope/commit", json_body={"image": "x"})
    assert missing.status == 404


def test_commit_is_one_instant_of_a_busy_sandbox(
    router: RouterProcess, grove: Grove, registry: Registry, base_layer: bytes, tmp_path: Path
) -> None:
    base = pulled_base(router, registry, base_layer, tmp_path, "busybase")
    with grove.create(base) as sb:
        # A writer that never stops: the counter goes to /data/a, then to /data/b (each whole, by a rename), and the
        # layer is read in that order: frozen, b is a's value or the one before; read while it runs, b runs ahead.
        r = sb.exec("mkdir /data && ln -s busybox /bin/setsid && setsid sh -c 'i=0; while true; do i=$((i+1)); "
                    "echo $i > /data/b.tmp; echo $i > /data/a.tmp; mv /data/a.tmp /data/a; mv /data/b.tmp /data/b; "
                    "done' "
                    ">/dev/null 2>&1 </dev/null & sleep 1; cat /data/a")
        assert r.exit_code == 0 and int(r.stdout) > 0, r.stderr
        reply = router.http("POST", f"/v1/sandboxes/{sb.id}/commit", json_body={"image": "busy"})
        assert reply.status == 201, reply.body
        assert int(sb.exec("cat /data/a").stdout) > 0  # thawed: the writer goes on
    with grove.create("busy") as snap:
        a, b = (int(snap.exec(f"cat /data/{n}").stdout) for n in ("a", "b"))
    assert a - 1 <= b <= a, (a, b)
