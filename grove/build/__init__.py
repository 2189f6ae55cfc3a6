"""Dockerfile builds without Docker: each step in a grove sandbox (:mod:`grove.build.builder`)."""
