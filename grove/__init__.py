"""grove's shared core: the error tree and the wire codec, used by executor, router and artifacts alike."""
