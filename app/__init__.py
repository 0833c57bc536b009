"""The volunteer's program, by role (docs/architecture.md, "The tree").

Modules directly in app/ are the shared base (identity, credentials, config, links,
errors, ...): they import none of app's sub-packages. serving/ runs a stage, client/
asks the swarm, api/ serves the OpenAI-compatible API, cli/ is the `sangama` command,
lab/ holds the loopback demos and swarms, ui/ is the desktop app and the only home of Qt.
"""
