"""HTTP: the routes' handlers and what they share (replies, ranges, events, the OpenAPI document)."""
