"""The Ray engine: one Ray actor per worker, in a placement group.

``engine.py`` is the driver's side (placement, launch, kill), ``handle.py`` one actor seen from
the driver and the thread that drains every actor's messages, ``actor.py`` what runs inside each
actor, ``placement.py`` the plain-data resource rules, ``reuse.py`` in-place recovery (the
survivors of a failed attempt serve the next).
"""
