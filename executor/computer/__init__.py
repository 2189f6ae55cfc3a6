"""Computer use inside a sandbox: the screen (:mod:`.desktop`), the actions of both vendors' tools
(:mod:`.actions`, :mod:`.keys`), and screenshots read from the framebuffer and written as PNG
(:mod:`.framebuffer`, :mod:`.png`)."""
