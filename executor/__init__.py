"""The daemon inside every grove sandbox: exec, files and archives over HTTP (Flask under gunicorn).

It knows nothing of routers or backends; its only inputs are :class:`executor.settings.ExecutorSettings`
and the requests it is sent.
"""
