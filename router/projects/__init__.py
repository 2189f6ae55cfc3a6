"""Projects: who a caller is (an API key's project and role), what a project may hold (its quotas and
retention), and where its definitions live (``<state>/projects/<name>.json``)."""
