"""The local backend: sandboxes as namespaced process trees on this host, with images as directories."""
