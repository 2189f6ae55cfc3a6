"""Sandbox backends behind one protocol (:mod:`router.backends.base`): ``local`` and ``knative``."""
