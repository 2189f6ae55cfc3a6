"""E2B's code interpreter SDK (``e2b-code-interpreter``), unchanged, against grove: ``run_code`` through grove's
E2B endpoint (``E2b-Sandbox-Port: 49999``, the port proxy) to grove's code interpreter server
(:mod:`grove.integrations.e2b_interpreter`) in the sandbox, on a real ``ipykernel``.

The sandbox is of the default image (the host's ``/usr``); the server's libraries are this venv's, uploaded
(:mod:`tests.support.sandbox_servers`), and the server is started as an E2B template's start command would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b.exceptions import NotFoundException, SandboxException
from e2b_code_interpreter import Sandbox

from tests.integrations.test_e2b import steps_of
from tests.support.router_fixtures import RouterProcess, wait_for
from tests.support.sandbox_servers import INTERPRETER_PORT as PORT
from tests.support.sandbox_servers import drop_libs_dirs, start_interpreter


@pytest.fixture
def interpreter(router: RouterProcess, e2b_env: None) -> Iterator[Sandbox]:
    sbx = Sandbox.create("base", timeout=300)
    with router.client() as client:
        start_interpreter(client.attach(sbx.sandbox_id))
    yield sbx
    drop_libs_dirs()


def test_run_code_results_stdout_errors_and_state(router: RouterProcess, interpreter: Sandbox) -> None:
    printed: list[str] = []
    first = interpreter.run_code("x = 41\nprint('hello', x)\nx + 1", on_stdout=lambda m: printed.append(m.line))
    assert first.error is None and first.logs.stdout == ["hello 41\n"] and printed == ["hello 41\n"]
    assert first.text == "42" and first.results[0].is_main_result
    assert interpreter.run_code("x * 2").text == "82"  # state kept between calls

    failed = interpreter.run_code("def f():\n    return 1 / 0\nf()")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert failed.error.value == "division by zero" and "f()" in failed.error.traceback
    assert interpreter.run_code("import sys; print('oops', file=sys.stderr)").logs.stderr == ["oops\n"]
    html = interpreter.run_code("from IPython.display import HTML; HTML('<b>bold</b>')")
    assert html.results[0].html == "<b>bold</b>"
    env = interpreter.run_code("import os; os.environ['GREETING']", envs={"GREETING": "hi"})
    assert env.text == "'hi'"
    assert interpreter.run_code("import os; os.environ.get('GREETING')").text is None  # only for that call

    # A context of its own: its own state, its own directory.
    context = interpreter.create_code_context(cwd="/tmp")
    assert interpreter.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
    assert interpreter.run_code("'x' in globals()", context=context).text == "False"
    assert context.id in [c.id for c in interpreter.list_code_contexts()]
    interpreter.remove_code_context(context)
    with pytest.raises(NotFoundException, match="not found"):
        interpreter.run_code("1", context=context)

    # Every call went through the port proxy: the sandbox's trajectory counts the port's traffic.
    traffic = wait_for(lambda: [s for s in steps_of(router, interpreter.sandbox_id)
                                if s["type"] == "port_traffic" and s["port"] == PORT], 30, what="port traffic")
    assert sum(s["requests"] for s in traffic) >= 1 and "200" in traffic[0]["statuses"]


def test_bad_input_to_the_interpreter_is_refused_with_a_message(router: RouterProcess,
                                                                interpreter: Sandbox) -> None:
    with pytest.raises(SandboxException, match="only python"):
        interpreter.run_code("1", language="r")
    assert interpreter.run_code("1 + 1").text == "2"  # nothing else disturbed
