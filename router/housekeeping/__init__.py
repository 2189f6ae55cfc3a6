"""Housekeeping of what the router stores: what each project holds in object storage (a report), collecting
what is past its project's retention (and image layers nothing uses on this host), and the stored-bytes
figure a ``stored_bytes`` quota reads.

- :mod:`.kinds`: what a project keeps, by kind (trajectories, pushed files, full outputs, run files), and how
  a kind's objects group into the items that are kept or collected whole;
- :mod:`.scan`: one project's part of the bucket listed and grouped into items;
- :mod:`.collect`: which items a pass collects (past retention, owned by nothing live), and removing them;
- :mod:`.usage`: the per-project stored bytes, as last measured;
- :mod:`.keeper`: the service's housekeeper: reports, passes on request and every ``gc_interval_h`` hours.
"""
