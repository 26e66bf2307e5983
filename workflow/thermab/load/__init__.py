"""load: the closed-loop load. ``runner`` (Locust in its own process, ``LoadSpec``),
``locustfile`` (package data, also usable on its own), ``validity`` (was the load the load
intended), ``prompts``."""
