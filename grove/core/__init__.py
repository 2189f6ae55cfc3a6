"""grove's shared kernel: what the router, the executor and the SDK all speak — the error tree (``errors``), the wire
codec (``wire``), request models and their schema (``schema``), the exec contract (``api``) and the artifact entry
(``artifact``). It imports nothing of grove outside itself; the runtime bundle takes it whole."""
