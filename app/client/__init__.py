"""Asking the swarm: the swarm client, the one way to connect it (`connect`), the route
from the coordinator and one chat turn. Headless; knows no serving, API or lab."""
