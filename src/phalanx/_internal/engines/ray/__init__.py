"""The Ray engine: one Ray actor per worker, in a placement group.

``engine.py`` is the driver's side (placement, launch, kill), ``start.py`` starting a launch's
actors and awaiting their hellos, ``handle.py`` one actor seen from the driver and the thread
that drains every actor's messages, ``actor.py`` what runs inside each actor (with ``calls.py``
running its calls and ``output.py`` sending its output), ``placement.py`` the plain-data resource
rules, ``elastic.py`` the size of an elastic group, ``gcs.py`` the bounded questions to the GCS,
``reuse.py`` in-place recovery (the survivors of a failed attempt are kept for the next) and
``relaunch.py`` the next attempt started around them.
"""
