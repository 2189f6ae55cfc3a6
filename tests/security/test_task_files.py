"""Issue 29, low 4: a task's ``files`` may not name any host path.

Before the fix ``{"files": "../../somewhere"}`` or an absolute path uploaded that host directory into the
sandbox: a third-party task set could name the state dir and its ``api_keys``; ``"files": "/"`` built a
tar of the whole host in memory. Now the path must lie under the task set's own directory (or
``--tasks-root``), wherever its symlinks lead, and an upload is spooled to disk with a size cap.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from grove.client import Grove
from grove.client.upload import spool_tar
from grove.core.errors import Invalid
from grove.rollouts.tasks import TaskFileError, load_tasks
from tests.support.router_fixtures import RouterProcess


def _task_file(where: Path, **fields: Any) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    line = {"id": "t", "prompt": "p", "check": {"test": "true"}, **fields}
    path = where / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    return path


@pytest.mark.fast
@pytest.mark.parametrize("files", ["../secrets", "/", "/etc", "project/../../secrets"])
def test_files_outside_the_task_set_are_refused(tmp_path: Path, files: str) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "set" / "project").mkdir(parents=True)
    with pytest.raises(TaskFileError) as caught:
        load_tasks(_task_file(tmp_path / "set", files=files))
    message = str(caught.value)
    assert "line 1" in message and "'files'" in message and "outside the task set's directory" in message, message
    assert "--tasks-root" in message


@pytest.mark.fast
def test_a_symlink_out_of_the_task_set_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "set").mkdir()
    os.symlink(tmp_path / "secrets", tmp_path / "set" / "project")
    with pytest.raises(TaskFileError, match="outside the task set's directory"):
        load_tasks(_task_file(tmp_path / "set", files="project"))


@pytest.mark.fast
def test_inside_and_with_a_tasks_root_are_fine(tmp_path: Path) -> None:
    (tmp_path / "set" / "project").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    assert load_tasks(_task_file(tmp_path / "set", files="project"))[0].files == str(tmp_path / "set" / "project")
    path = _task_file(tmp_path / "set", files="../shared")
    with pytest.raises(TaskFileError):
        load_tasks(path)
    assert load_tasks(path, files_root=tmp_path)[0].files == str(tmp_path / "shared")
    # A directory of task sets: files may point anywhere under the directory given.
    nested = tmp_path / "many" / "one"
    nested.mkdir(parents=True)
    (tmp_path / "many" / "data").mkdir()
    (nested / "task.json").write_text(json.dumps({"id": "n", "prompt": "p", "check": {"test": "true"},
                                                  "files": "../data"}))
    assert load_tasks(tmp_path / "many")[0].files == str(tmp_path / "many" / "data")


@pytest.mark.fast
def test_an_upload_is_spooled_and_capped(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob").write_bytes(os.urandom(1 << 20))
    with pytest.raises(Invalid, match="more than 65536 bytes"):
        spool_tar(tmp_path / "big", max_bytes=1 << 16)
    with spool_tar(tmp_path / "big") as spool:
        assert spool.seek(0, os.SEEK_END) > 1 << 20


def test_upload_streams_a_directory_into_a_sandbox(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    (tmp_path / "p" / "sub").mkdir(parents=True)
    (tmp_path / "p" / "sub" / "f.txt").write_text("hello\n")
    os.symlink("sub/f.txt", tmp_path / "p" / "link")  # copied as a link, not as what it points to
    sb = grove.create()
    try:
        assert sb.upload(tmp_path / "p", "/workspace/p") >= 3
        r = sb.exec("cat /workspace/p/sub/f.txt; readlink /workspace/p/link")
        assert r.stdout == b"hello\nsub/f.txt\n", r
    finally:
        sb.close()
