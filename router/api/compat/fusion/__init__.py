"""SandboxFusion's ``POST /run_code`` (the code-reward path of verl and others), served at
``{router}/sandbox-fusion/run_code``: every request in a fresh sandbox claimed from a warm pool."""
