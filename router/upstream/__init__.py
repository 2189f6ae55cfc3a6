"""The executor's client: every call the router makes to a sandbox's executor."""
