"""Loopback demos and swarms: `sangama demo`, local pipelines, child `sangama` processes.

Only app.cli, bench/ and tests/ import the lab: nothing a volunteer runs depends on it."""
