"""Ports, signed port URLs, the terminal and MCP: servers in a sandbox reached through its executor."""
