"""The `sangama` command (`app.cli.main`) and the operator tools behind its sub-commands
(coordinator, invites, relay, hardware). Headless: imports no Qt."""
