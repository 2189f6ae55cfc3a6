"""The Knative backend's parts: options, manifests, the Kubernetes API wrapper, informers, rate limits.

:mod:`router.backends.knative` puts them together behind the ``Backend`` protocol. Only
:mod:`router.knative.kube` and :mod:`router.knative.informer` import the ``kubernetes`` client, so the
manifests (``grove knative manifest``) are built without it.
"""
