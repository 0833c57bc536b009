"""Serving a stage: the worker loop and its session rules, the link to the next stage,
the static and the coordinated serve loops. Headless; knows no client, API or lab."""
