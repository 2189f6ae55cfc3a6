"""Tests of grove.rollouts: pure logic (fast) and runs against real routers and sandboxes."""
