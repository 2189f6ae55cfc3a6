"""The Knative backend's parts: options, manifests, the Kubernetes API wrapper, informers, rate limits.

:mod:`router.backends.knative.backend` puts them together behind the ``Backend`` protocol. Only
:mod:`router.backends.knative.kube` and :mod:`router.backends.knative.informer` import the ``kubernetes`` client, so the
manifests (``grove knative manifest``) are built without it.
"""
